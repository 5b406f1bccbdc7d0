"""``hora.ray.RayExecutor``: a hora job whose ranks live in Ray actors."""
from __future__ import annotations

import dataclasses
import sys
import threading
import time

from hora.cluster import channel
from hora.cluster.driver_service import DriverService, group_hosts
from hora.cluster.job import JobError, MpiJob, root_cause_order


def _ray():
    try:
        import ray
    except ImportError:
        raise ImportError("hora.ray needs Ray: pip install 'hora[ray]'") from None
    return ray


@dataclasses.dataclass
class RaySettings:
    """What :meth:`RayExecutor.create_settings` returns."""
    timeout_s: float = 300.0
    placement_group_timeout_s: float = 100.0
    nics: set | None = None
    verbose: int = 1
    extra_mpi_args: str | None = None
    ssh_identity_file: str | None = None


class RayExecutor:
    """Horovod's ``RayExecutor``: ``num_workers`` ranks (or ``num_hosts`` x
    ``num_workers_per_host``) as Ray actors in a placement group, joined into
    one hora job over MPI. ``start()`` launches it; ``run``/``execute`` call a
    function on every rank; ``shutdown()`` ends it."""

    @classmethod
    def create_settings(cls, timeout_s=300, ssh_identity_file=None, ssh_str=None,
                        placement_group_timeout_s=100, nics=None, verbose=1,
                        extra_mpi_args=None):
        """``timeout_s`` bounds the start of the ranks; the ssh arguments are
        accepted for Horovod compatibility and unused (mpirun reaches the
        actors without ssh)."""
        del ssh_str
        return RaySettings(timeout_s=timeout_s, placement_group_timeout_s=placement_group_timeout_s,
                           nics=nics, verbose=verbose, extra_mpi_args=extra_mpi_args,
                           ssh_identity_file=ssh_identity_file)

    def __init__(self, settings=None, num_workers=None, num_hosts=None, num_workers_per_host=1,
                 cpus_per_worker=1, use_gpu=False, gpus_per_worker=None):
        if gpus_per_worker and not use_gpu:
            raise ValueError("gpus_per_worker is set, but use_gpu is False")
        if use_gpu and gpus_per_worker is not None and gpus_per_worker < 1:
            raise ValueError(f"gpus_per_worker must be at least 1, got {gpus_per_worker}")
        if num_workers is None and num_hosts is None:
            raise ValueError("RayExecutor needs num_workers, or num_hosts and "
                             "num_workers_per_host")
        if num_workers is not None and num_hosts is not None:
            raise ValueError("give either num_workers or num_hosts, not both")
        self.settings = settings or RaySettings()
        self.num_hosts = num_hosts
        self.num_workers_per_host = num_workers_per_host or 1
        self.num_workers = (num_workers if num_workers is not None
                            else num_hosts * self.num_workers_per_host)
        if self.num_workers < 1:
            raise ValueError(f"RayExecutor needs at least one worker, got {self.num_workers}")
        self.cpus_per_worker = cpus_per_worker
        self.use_gpu = use_gpu
        self.gpus_per_worker = (gpus_per_worker or 1) if use_gpu else 0
        self.workers = []
        self._actors = []
        self._placement_group = None
        self._driver = None
        self._job = None
        self._ended = None
        self._lock = threading.Lock()

    # -- starting ----------------------------------------------------------
    def _log(self, text):
        if self.settings.verbose >= 1:
            print(text, file=sys.stderr, flush=True)

    def _make_placement_group(self, ray):
        from ray.util.placement_group import placement_group
        per_worker = {"CPU": self.cpus_per_worker}
        if self.use_gpu:
            per_worker["GPU"] = self.gpus_per_worker
        if self.num_hosts is not None:
            per_host = {name: value * self.num_workers_per_host
                        for name, value in per_worker.items()}
            group = placement_group([per_host] * self.num_hosts, strategy="STRICT_SPREAD")
        else:
            group = placement_group([per_worker] * self.num_workers, strategy="PACK")
        ready, _ = ray.wait([group.ready()], timeout=self.settings.placement_group_timeout_s)
        if not ready:
            from ray.util.placement_group import remove_placement_group
            remove_placement_group(group)
            raise JobError(f"RayExecutor: the cluster did not grant {self.num_workers} workers "
                           f"x {per_worker} within {self.settings.placement_group_timeout_s:g} "
                           f"s (ray.cluster_resources(): {ray.cluster_resources()})")
        return group

    def start(self, executable_cls=None, executable_args=None, executable_kwargs=None,
              extra_env_vars=None):
        """Create the actors and launch the hora job across them. Each rank
        makes ``executable_cls(*executable_args, **executable_kwargs)`` (for
        :meth:`execute`); ``extra_env_vars`` go into every rank's environment."""
        ray = _ray()
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from hora.ray.worker import RankWorker
        if self._job is not None:
            raise RuntimeError("RayExecutor.start: already started; shutdown() first")
        started = time.monotonic()
        try:
            self._placement_group = self._make_placement_group(ray)
            options = {"num_cpus": self.cpus_per_worker, "num_gpus": self.gpus_per_worker}
            actor_cls = ray.remote(RankWorker)
            for index in range(self.num_workers):
                bundle = (index if self.num_hosts is None
                          else index // self.num_workers_per_host)
                strategy = PlacementGroupSchedulingStrategy(
                    placement_group=self._placement_group, placement_group_bundle_index=bundle)
                self._actors.append(actor_cls.options(scheduling_strategy=strategy,
                                                      **options).remote())
            key = channel.new_key()
            self._driver = DriverService(key, channel.local_address(
                ray.util.get_node_ip_address()))
            self._driver.set_job(channel.dumps((executable_cls, tuple(executable_args or ()),
                                                dict(executable_kwargs or {}))))
            ray.get([actor.start_service.remote(index, self._driver.address, key)
                     for index, actor in enumerate(self._actors)],
                    timeout=self.settings.timeout_s)
            reason = self._driver.wait_for_tasks(self.num_workers, self.settings.timeout_s)
            if reason:
                raise JobError(f"RayExecutor: only {len(self._driver.tasks())} of "
                               f"{self.num_workers} actors registered within "
                               f"{self.settings.timeout_s:g} s")
            groups = group_hosts(self._driver.tasks().values())
            self._driver.set_hosts(groups)
            self._job = MpiJob(self._driver, groups, "serve", env=extra_env_vars,
                               extra_mpi_args=self.settings.extra_mpi_args,
                               nics=self.settings.nics, verbose=self.settings.verbose,
                               start_timeout=max(60.0, self.settings.timeout_s), log=self._log)
            reason = self._driver.wait_for_rank_addresses(
                self.num_workers, self.settings.timeout_s,
                stopped=lambda: None if self._job.poll() is None else "the MPI job ended")
            if reason:
                raise JobError(f"RayExecutor: the ranks did not all start ({reason}); "
                               f"the job's last output:\n{self._job.tail()}")
            addresses = self._driver.rank_addresses()
            self.workers = self._match_ranks(groups, addresses)
            ray.get([worker.attach.remote(rank, addresses[rank][1], key)
                     for rank, worker in enumerate(self.workers)])
        except BaseException:
            self.shutdown()
            raise
        threading.Thread(target=self._watch, name="hora-ray-watch", daemon=True).start()
        self._log(f"RayExecutor: {self.num_workers} ranks on "
                  f"{', '.join(f'{g.hostname} ({len(g.tasks)})' for g in groups)} started in "
                  f"{time.monotonic() - started:.1f} s")

    def _match_ranks(self, groups, addresses):
        """Actor of each rank: mpirun fills the hosts' slots in order, so the
        ranks on a host go to that host's actors, lowest first."""
        by_host = {}
        for rank in sorted(addresses):
            by_host.setdefault(addresses[rank][0], []).append(rank)
        workers = [None] * self.num_workers
        for group in groups:
            ranks = by_host.get(group.hostname, [])
            if len(ranks) != len(group.tasks):
                raise JobError(f"RayExecutor: host {group.hostname} has {len(group.tasks)} "
                               f"actors but {len(ranks)} ranks")
            for rank, index in zip(ranks, group.tasks):
                workers[rank] = self._actors[index]
        return workers

    def _watch(self):
        job = self._job
        code = job.wait() if job is not None else None
        with self._lock:
            if self._job is job and self._ended is None:
                self._ended = f"the MPI job ended with exit code {code}"

    # -- calling -----------------------------------------------------------
    def _require_started(self):
        if not self.workers:
            raise RuntimeError("RayExecutor: not started; call start() first")

    def _stop_job(self, why):
        with self._lock:
            if self._ended is None:
                self._ended = why
            job = self._job
        if job is not None:
            job.stop()

    def _submit(self, fn, args, kwargs, with_executable, workers):
        self._require_started()
        if self._ended is not None:
            raise JobError(f"RayExecutor: the hora job is over ({self._ended}); call "
                           "shutdown() and start() again")
        payload = channel.dumps((fn, tuple(args or ()), dict(kwargs or {}), with_executable))
        return [worker.execute.remote(payload) for worker in workers]

    def run_remote(self, fn, args=None, kwargs=None):
        """Start ``fn(*args, **kwargs)`` on every rank; returns the Ray object
        references, in rank order."""
        return self._submit(fn, args, kwargs, False, self.workers)

    def _gather(self, refs):
        """Values in rank order; on failure, the most telling error: a rank's
        own exception before the ranks its end took down."""
        ray = _ray()
        values, errors = [None] * len(refs), {}
        pending = {ref: rank for rank, ref in enumerate(refs)}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            rank = pending.pop(done[0])
            try:
                values[rank] = ray.get(done[0])
            except Exception as exc:  # noqa: BLE001 - sorted out below
                errors[rank] = exc
                if len(errors) == 1 and pending:
                    if isinstance(exc, ray.exceptions.RayActorError):
                        # the rank may live on under another actor's daemon:
                        # the job cannot go on without it
                        self._stop_job(f"the actor of rank {rank} died")
                    # the other ranks end within seconds once the job is down
                    ray.wait(list(pending), num_returns=len(pending), timeout=15)
        if errors:
            error = self._explain(errors)
            with self._lock:
                if self._ended is None:
                    self._ended = f"rank {error.rank} failed"
            raise error
        return values

    def _explain(self, errors):
        """One JobError for a failed call: a rank's own exception first, then
        a dead actor, then what the other ranks saw of it."""
        ray = _ray()
        causes = {}
        for rank, exc in errors.items():
            cause = getattr(exc, "cause", None) if isinstance(exc, ray.exceptions.RayTaskError) \
                else exc
            causes[rank] = cause if cause is not None else exc
        raised = sorted(((rank, cause) for rank, cause in causes.items()
                         if isinstance(cause, JobError) and cause.error_type),
                        key=lambda item: root_cause_order(
                            item[1].error_type, getattr(item[1], "failed_at", 0.0), item[0]))
        dead = sorted(rank for rank, cause in causes.items()
                      if isinstance(cause, ray.exceptions.RayActorError))
        if raised and (not dead or root_cause_order(raised[0][1].error_type, 0, 0)[0] is False):
            cause = raised[0][1]
            return JobError(f"RayExecutor: {cause}", rank=cause.rank, host=cause.host,
                            error_type=cause.error_type,
                            remote_traceback=cause.remote_traceback)
        if dead:
            text = str(causes[dead[0]]).strip()
            return JobError(f"RayExecutor: the actor of rank {dead[0]} died: "
                            f"{text.splitlines()[0] if text else 'no reason given'}",
                            rank=dead[0])
        rank, cause = sorted(causes.items())[0]
        return JobError(f"RayExecutor: {cause}", rank=getattr(cause, "rank", rank),
                        host=getattr(cause, "host", None))

    def run(self, fn, args=None, kwargs=None):
        """``fn(*args, **kwargs)`` on every rank; the values in rank order."""
        return self._gather(self.run_remote(fn, args, kwargs))

    def execute(self, fn):
        """``fn(executable)`` on every rank, with the object made by start()."""
        return self._gather(self._submit(fn, (), {}, True, self.workers))

    def execute_single(self, fn):
        """``fn(executable)`` on rank 0 only."""
        return self._gather(self._submit(fn, (), {}, True, self.workers[:1]))[0]

    # -- ending --------------------------------------------------------------
    def shutdown(self):
        """Stop the ranks, the MPI job and the actors; leaves no process."""
        ray = _ray()
        if self.workers:
            try:
                ray.get([worker.stop.remote() for worker in self.workers], timeout=30)
            except Exception:  # noqa: BLE001 - actors may be dead already
                pass
        with self._lock:
            job, self._job = self._job, None
        if job is not None:
            job.wait(10)
            job.stop()
        if self._driver is not None:
            self._driver.close()
            self._driver = None
        for actor in self._actors:
            try:
                ray.kill(actor)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self._actors, self.workers = [], []
        if self._placement_group is not None:
            from ray.util.placement_group import remove_placement_group
            try:
                remove_placement_group(self._placement_group)
            except Exception:  # noqa: BLE001 - the cluster may be shutting down
                pass
            self._placement_group = None
        self._ended = None
