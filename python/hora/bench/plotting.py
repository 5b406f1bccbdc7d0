"""Bus bandwidth against message size, as every size sweep draws it (the
main benchmark's --plot and multihost's). Apart from the benchmarks, so
that drawing never imports one of them (and its MPI start-up)."""

COLORS = {"hora": "tab:blue", "mpi": "tab:green", "gloo": "tab:purple", "horovod": "tab:red"}


def busbw_plot(series, title, path, lines=()):
    """Draws ``series`` (name -> [(bytes per rank, busbw in GB/s)]) into the
    PNG ``path``, hora's line thicker; ``lines`` are horizontal references
    as (GB/s, label, linestyle, colour)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4.5))
    for name in sorted(series):
        axis.plot(*zip(*series[name]), marker="o", label=name, color=COLORS.get(name),
                  linewidth=2.5 if name == "hora" else 1.5)
    for value, label, style, colour in lines:
        axis.axhline(value, color=colour, linestyle=style, linewidth=1, label=label)
    axis.set_xscale("log", base=2)
    if lines:
        axis.set_ylim(bottom=0)
    axis.set_xlabel("bytes per rank")
    axis.set_ylabel("bus bandwidth (GB/s)")
    axis.set_title(title)
    axis.grid(True, alpha=0.3)
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
