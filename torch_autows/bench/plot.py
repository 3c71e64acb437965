"""PNG plot of one run: TFLOP/s per case, one bar series per peer; failed rows marked with a red x at 0."""
from __future__ import annotations

from pathlib import Path

from .report import OURS, impl_order, ok


def plot_rows(rows: list[dict], path: Path, title: str = "") -> Path | None:
    """Write the plot; returns the path, or None when there are no rows."""
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    cases = list(dict.fromkeys(r["case"] for r in rows))
    impls = impl_order(rows, OURS)
    by = {(r["case"], r["impl"]): r for r in rows}
    n = len(impls)
    width = 0.8 / max(n, 1)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(cases) * max(1, n) / 3 + 2), 4.5))
    labelled_fail = False
    for j, impl in enumerate(impls):
        xs = [i + (j - (n - 1) / 2) * width for i in range(len(cases))]
        vals = [by[(c, impl)]["tflops"] if ok(by.get((c, impl))) else 0.0 for c in cases]
        ax.bar(xs, vals, width, label=impl, edgecolor="black" if impl == OURS else None,
               linewidth=1.2 if impl == OURS else 0)
        failed = [x for x, c in zip(xs, cases) if (c, impl) in by and not ok(by[(c, impl)])]
        if failed:
            ax.scatter(failed, [0.0] * len(failed), marker="x", color="red", zorder=3,
                       label=None if labelled_fail else "failed")
            labelled_fail = True
    ax.set_xticks(range(len(cases)))
    ax.set_xticklabels(cases, rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("TFLOP/s")
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, ncol=min(n + 1, 4))
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
