"""PNG plot of one run: each peer's TFLOP/s relative to the best other peer of the case (1.0 = that peer).

The bars answer the question a run asks, "how does autows compare with the best alternative here?":
per case, every peer's TFLOP/s divided by the best non-autows peer's, with a reference line at 1.0. Cases
are split into panels (attention and its backward: one per head dim / causal / GQA, the seqlen along the x axis; other
works: at most ``PANEL_CASES`` cases per panel), the legend sits below the panels, and each peer keeps
its colour in every plot (autows always red with a black edge). A failed row (error or over tolerance:
no time) is an ``x`` on the panel's floor. Needs matplotlib (``pip install 'torch_autows[bench]'``);
:func:`try_plot` turns its absence into a one-line note.
"""
from __future__ import annotations

import math
import re
import zlib
from collections.abc import Callable
from pathlib import Path

from .report import OURS, impl_order, ok, rate, summarize

#: One colour per peer name in every plot; names not listed get a stable colour from ``_SPARE``.
COLORS = {
    OURS: "#d62728",
    "cublas": "#1f77b4", "cudnn": "#1f77b4",  # the vendor library of the work
    "inductor-max-autotune": "#ff7f0e", "inductor": "#2ca02c", "eager": "#8c564b",
    "triton-autows": "#9467bd", "gluon-reference": "#17becf", "fa2": "#bcbd22", "flex": "#e377c2",
}
_SPARE = ("#7f7f7f", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd", "#e6550d")
PANEL_CASES = 12  # cases per panel for works without a natural grouping
MAX_COLS = 3
_ATTN = re.compile(r"^(?:(?P<gqa>gqa\d+x\d+)-)?s(?P<s>\d+)-d(?P<d>\d+)(?:v(?P<dv>\d+))?(?P<causal>-causal)?$")


def color(impl: str) -> str:
    """The colour of a peer, the same in every plot."""
    return COLORS.get(impl) or _SPARE[zlib.crc32(impl.encode()) % len(_SPARE)]


def panels(work: str, cases: list[str]) -> list[tuple[str, list[str], list[str]]]:
    """``[(title, cases, x tick labels)]``: attention by (GQA, head dim, causal) with the seqlen as the tick;
    any other work in chunks of ``PANEL_CASES`` with the case name as the tick."""
    if work in ("attention", "attention-bwd") and cases and all(_ATTN.match(c) for c in cases):
        groups: dict[tuple, list[str]] = {}
        for c in cases:
            m = _ATTN.match(c)
            groups.setdefault((m["gqa"] or "", m["d"] + (f"v{m['dv']}" if m["dv"] else ""), bool(m["causal"])),
                              []).append(c)
        out = []
        for (gqa, d, causal), cs in groups.items():
            title = f"d{d}" + (" causal" if causal else "") + (f" {gqa.upper().replace('X', '/')}" if gqa else "")
            out.append((title, cs, [_seqlen(_ATTN.match(c)["s"]) for c in cs]))
        return out
    n = max(1, math.ceil(len(cases) / PANEL_CASES))
    size = math.ceil(len(cases) / n) if cases else 0
    chunks = [cases[i:i + size] for i in range(0, len(cases), size)] if cases else []
    return [(work if n == 1 else f"{work} ({i + 1}/{n})", cs, cs) for i, cs in enumerate(chunks)]


def _seqlen(s: str) -> str:
    v = int(s)
    return f"{v // 1024}k" if v >= 1024 and v % 1024 == 0 else str(v)


def relative(rows: list[dict]) -> dict[tuple[str, str], float]:
    """``(case, impl) -> TFLOP/s / best other peer's TFLOP/s`` for rows with a time (autows included)."""
    rel = {}
    for s in summarize(rows, OURS):
        best = s["best_tflops"]
        if not best:
            continue
        for impl, row in s["by_impl"].items():
            if ok(row):
                rel[(s["case"], impl)] = rate(row) / best
    return rel


def plot_rows(rows: list[dict], path: Path, title: str = "", work: str | None = None) -> Path | None:
    """Write the plot; returns the path, or None when there are no rows. Raises ImportError without matplotlib."""
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    work = work or rows[0].get("work") or ""
    cases = list(dict.fromkeys(r["case"] for r in rows))
    impls = impl_order(rows, OURS)
    by = {(r["case"], r["impl"]): r for r in rows}
    rel = relative(rows)
    parts = panels(work, cases)
    ncols = min(MAX_COLS, len(parts))
    nrows = math.ceil(len(parts) / ncols)
    widest = max(len(cs) for _, cs, _ in parts)
    names_as_ticks = any(t == cs for _, cs, t in parts)
    panel_w = min(10.0, max(2.6, 0.15 * widest * max(1, len(impls)) + 0.8))
    panel_h = 2.9 + (0.9 if names_as_ticks else 0)
    vals = list(rel.values())
    lo = max(0.0, math.floor((min(vals + [0.9]) - 0.05) * 10) / 10)
    hi = math.ceil((max(vals + [1.1]) + 0.05) * 10) / 10
    fig, axes = plt.subplots(nrows, ncols, figsize=(max(7.0, ncols * panel_w), nrows * panel_h + 1.1), squeeze=False,
                             sharey=True, layout="constrained")
    width = 0.8 / max(len(impls), 1)
    failed_any = False
    for ax, (ptitle, pcases, ticks) in zip(axes.flat, parts):
        for j, impl in enumerate(impls):
            xs = [i + (j - (len(impls) - 1) / 2) * width for i in range(len(pcases))]
            ys = [rel.get((c, impl), 0.0) for c in pcases]
            ax.bar(xs, [y - lo if y else 0.0 for y in ys], width, bottom=lo, color=color(impl),
                   edgecolor="black" if impl == OURS else "none", linewidth=0.8)
            if impl == OURS:
                for x, y in zip(xs, ys):
                    if y:
                        ax.annotate(f"{y:.2f}", (x, y), xytext=(0, 2), textcoords="offset points", ha="center",
                                    va="bottom", fontsize=6.5, rotation=90 if len(impls) * len(pcases) > 24 else 0)
            bad = [x for x, c in zip(xs, pcases) if (c, impl) in by and not ok(by[(c, impl)])]
            if bad:
                failed_any = True
                ax.scatter(bad, [lo + 0.01 * (hi - lo)] * len(bad), marker="x", color="black", s=18, zorder=3)
        ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--", zorder=2)
        ax.set_title(ptitle, fontsize=9)
        ax.set_xticks(range(len(pcases)))
        slant = ticks == pcases and len(pcases) > 4  # long case names
        ax.set_xticklabels(ticks, rotation=40 if slant else 0, ha="right" if slant else "center", fontsize=7)
        ax.tick_params(axis="y", labelsize=7)
        ax.grid(axis="y", alpha=0.3)
        ax.set_ylim(lo, hi)
        if ticks != pcases:
            ax.set_xlabel("seqlen", fontsize=7)
    for ax in axes.flat[len(parts):]:
        ax.set_visible(False)
    for ax in axes[:, 0]:
        ax.set_ylabel("TFLOP/s / best other peer", fontsize=7.5)
    handles = [Patch(facecolor=color(i), edgecolor="black" if i == OURS else "none", label=i) for i in impls]
    handles.append(Line2D([], [], color="black", linestyle="--", linewidth=0.8, label="best other peer = 1.0"))
    if failed_any:
        handles.append(Line2D([], [], color="black", marker="x", linestyle="none", label="failed: no time"))
    fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 6), fontsize=7.5, frameon=False)
    fig.suptitle(title, fontsize=10)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def try_plot(rows: list[dict], path: Path, *, work: str | None = None, title: str = "",
             note: Callable[[str], None] = print) -> Path | None:
    """:func:`plot_rows`, or None and a one-line note when matplotlib is missing (the results are kept)."""
    try:
        return plot_rows(rows, path, title=title, work=work)
    except ImportError as e:
        note(f"note: plot skipped ({e}); pip install matplotlib, or the [bench] extra, for the PNGs")
        return None


def regenerate_plots(results_dir: Path, note: Callable[[str], None] = print) -> list[Path]:
    """Redraw ``<json>.png`` for every readable result JSON in ``results_dir``; stops at the first missing
    matplotlib (one note). Returns the PNGs written."""
    from .report import work_of
    from .results import load_json

    written = []
    results_dir = Path(results_dir)
    for f in sorted(results_dir.glob("*.json")) if results_dir.is_dir() else []:
        try:
            data = load_json(f)
        except (ValueError, OSError):
            continue  # BENCHMARKS.md lists it as unreadable
        gpu = data["meta"].get("gpu") or "no GPU"
        try:
            png = plot_rows(data["rows"], f.with_suffix(".png"), title=f"{f.stem}: {gpu}",
                            work=work_of(f, data["meta"]))
        except ImportError as e:
            note(f"note: plots skipped ({e}); pip install matplotlib, or the [bench] extra, for the PNGs")
            break
        if png:
            written.append(png)
    return written
