"""The plot of ``python -m benchmarks --plot``: overhead against leaves.

One panel per checks level (``hot_step off``, ``fast``, ``full``) and one for
the peers (``jax.jit`` donated and plain, ``eqx.filter_jit``): each state
kind's ratio to the raw compiled call against the number of leaves, read
from the ``states`` benchmark's ``meta["overhead"]``, with the level's budget
and the A/A control (the method's resolution) drawn in every panel.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from benchmarks._common import Result

__all__ = ["plot_states"]

PANELS = ("hot_step off", "hot_step fast", "hot_step full", "peers")
PEERS = {"jax.jit donated": "-", "jax.jit plain": "--", "eqx.filter_jit": ":"}


def plot_states(results: Sequence[Result], path: str) -> str:
    """Draw the ``states`` result into ``path`` (PNG, SVG... by its suffix).

    Returns what was written, or raises ``LookupError`` when no ``states``
    result is among ``results`` and ``ImportError`` without matplotlib.
    """
    res = next((r for r in results if r.benchmark == "states" and r.meta.get("overhead")), None)
    if res is None:
        raise LookupError("no states benchmark in this run: add it (--only states) to plot it")
    import matplotlib

    matplotlib.use("Agg")  # a file, no display
    import matplotlib.pyplot as plt

    overhead: dict[str, dict[str, list[list[float]]]] = res.meta["overhead"]
    budgets: dict[str, float] = res.meta.get("budgets", {})
    kinds = list(overhead)
    colors = {k: plt.get_cmap("tab10")(i % 10) for i, k in enumerate(kinds)}
    fig, axes = plt.subplots(1, len(PANELS), figsize=(5.2 * len(PANELS), 4.6), sharex=True)
    for ax, panel in zip(axes, PANELS):
        for kind in kinds:
            series = overhead[kind]
            if panel == "peers":
                for peer, style in PEERS.items():
                    _line(ax, series.get(peer), colors[kind], style, None)
            else:
                _line(ax, series.get(panel), colors[kind], "-", kind, marker="o")
            _line(ax, series.get("raw A/A"), "0.6", (0, (1, 2)), None)
        if panel == "peers":
            for peer, style in PEERS.items():  # the legend of the line styles
                ax.plot([], [], color="0.2", ls=style, label=peer)
        if panel in budgets:
            ax.axhline(budgets[panel], color="crimson", lw=1, ls="--", label=f"budget {budgets[panel]:.2f}x")
        ax.axhline(1.0, color="0.3", lw=0.8)
        ax.set_xscale("log")
        ax.set_title(panel if panel != "peers" else "peers (line style), by kind (colour)")
        ax.set_xlabel("leaves")
        ax.grid(True, which="both", alpha=0.25)
        ax.legend(fontsize=7, loc="upper left")
        if panel == "peers":
            ax.set_yscale("log")
    axes[0].set_ylabel("x raw compiled call (ratio of medians)")
    versions = res.meta.get("versions", {})
    fig.suptitle(
        f"jaxcontracts {versions.get('jaxcontracts', '?')} per-call overhead by state kind "
        f"(jax {versions.get('jax', '?')}, {res.meta.get('cpu', '?')}, {res.meta.get('date', '?')}; "
        "dotted grey: A/A control)",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _line(ax: Any, points: list[list[float]] | None, color: Any, style: Any, label: str | None, **kw: Any) -> None:
    if not points:
        return
    points = sorted(points)
    ax.plot([p[0] for p in points], [p[1] for p in points], color=color, ls=style, lw=1.4, label=label, **kw)
