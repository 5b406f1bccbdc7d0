"""``horarun --config-file FILE``: Horovod's YAML configuration file.

Its sections and keys are Horovod's (``controller``, ``params``,
``autotune``, ``timeline``, ``stall_check``, ``library_options``,
``logging``); each key sets the command-line option of the same meaning
unless that option was given on the command line. A key Horovod does not
know is an error that names it, so a typo never passes unnoticed.
"""

from __future__ import annotations

from typing import Any


# the engine's log levels, and Horovod's (given upper case; fatal is logged
# as error)
LOG_LEVELS = ("trace", "debug", "info", "warning", "error", "fatal", "off")


class ConfigError(ValueError):
    """The file cannot be read, or holds something horarun cannot use."""


# section -> {key: the option's attribute on the parsed arguments}
_SECTIONS: dict[str, dict[str, str]] = {
    "params": {k: k for k in ("fusion_threshold_mb", "cycle_time_ms", "cache_capacity",
                              "hierarchical_allreduce", "hierarchical_allgather",
                              "torus_allreduce")},
    "autotune": {"enabled": "autotune",
                 **{k: f"autotune_{k}" for k in ("log_file", "warmup_samples", "steps_per_sample",
                                                 "bayes_opt_max_samples",
                                                 "gaussian_process_noise")}},
    "timeline": {"filename": "timeline_filename", "mark_cycles": "timeline_mark_cycles"},
    "stall_check": {"enabled": "no_stall_check",
                    "warning_time_seconds": "stall_check_warning_time_seconds",
                    "shutdown_time_seconds": "stall_check_shutdown_time_seconds"},
    "library_options": {k: k for k in ("mpi_threads_disable", "num_nccl_streams",
                                       "thread_affinity", "gloo_timeout_seconds")},
    "logging": {"level": "log_level", "with_timestamp": "log_with_timestamp"},
}

_NUMBERS = {"fusion_threshold_mb", "cycle_time_ms", "cache_capacity", "autotune_warmup_samples",
            "autotune_steps_per_sample", "autotune_bayes_opt_max_samples",
            "autotune_gaussian_process_noise", "stall_check_warning_time_seconds",
            "stall_check_shutdown_time_seconds", "num_nccl_streams", "thread_affinity",
            "gloo_timeout_seconds"}
_FLAGS = {"hierarchical_allreduce", "hierarchical_allgather", "torus_allreduce", "autotune",
          "timeline_mark_cycles", "no_stall_check", "mpi_threads_disable", "log_with_timestamp"}


def load(path: str) -> dict[str, Any]:
    """The file's content, a mapping of sections."""
    try:
        import yaml  # type: ignore[import-untyped]
    except ImportError:
        raise ConfigError("--config-file needs PyYAML: pip install pyyaml") from None
    try:
        with open(path, encoding="utf-8") as f:
            config = yaml.safe_load(f)
    except OSError as exc:
        raise ConfigError(f"--config-file {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"--config-file {path}: not YAML: {exc}") from None
    if config is None:
        return {}
    if not isinstance(config, dict):
        raise ConfigError(f"--config-file {path}: expected a mapping of sections, got "
                          f"{type(config).__name__}")
    return config


def apply(args: Any, config: dict[str, Any]) -> None:
    """Sets the options ``config`` gives on ``args`` (from argparse), except
    those given on the command line (not None there)."""
    for section, values in config.items():
        if section == "controller":
            _controller(args, values)
            continue
        keys = _SECTIONS.get(section)
        if keys is None:
            raise ConfigError(f"--config-file: unknown section {section!r} (Horovod's are "
                              f"controller, {', '.join(_SECTIONS)})")
        if values is None:
            continue
        if not isinstance(values, dict):
            raise ConfigError(f"--config-file: section {section!r} must be a mapping, got "
                              f"{values!r}")
        for key, value in values.items():
            attribute = keys.get(key)
            if attribute is None:
                raise ConfigError(f"--config-file: unknown key {key!r} in section {section!r} "
                                  f"(known: {', '.join(keys)})")
            if getattr(args, attribute) is not None:
                continue  # given on the command line
            setattr(args, attribute, _checked(section, key, attribute, value))


def _checked(section: str, key: str, attribute: str, value: Any) -> Any:
    where = f"--config-file: {section}.{key}"
    if attribute in _FLAGS:
        if not isinstance(value, bool):
            raise ConfigError(f"{where} must be true or false, got {value!r}")
        # stall_check.enabled is the opposite of --no-stall-check
        return not value if attribute == "no_stall_check" else value
    if attribute in _NUMBERS:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise ConfigError(f"{where} must be a number >= 0, got {value!r}")
        if attribute == "autotune_gaussian_process_noise" and value > 1:
            raise ConfigError(f"{where} must be in [0, 1], got {value!r}")
        return value
    if attribute == "log_level":
        if not isinstance(value, str) or value.lower() not in LOG_LEVELS:
            raise ConfigError(f"{where} must be one of {', '.join(LOG_LEVELS)}, got {value!r}")
        return value.lower()
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where} must be a file name, got {value!r}")
    return value


def _controller(args: Any, value: Any) -> None:
    if not isinstance(value, str) or value.lower() not in ("mpi", "gloo"):
        raise ConfigError(f"--config-file: controller must be mpi or gloo, got {value!r}")
    if value.lower() == "gloo":
        raise ConfigError("--config-file: controller gloo: hora has no Gloo controller; its "
                          "ranks talk over MPI, or over hora's own TCP transport with "
                          "--transport tcp (remove the controller line)")
