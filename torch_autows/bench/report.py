"""Tables, ratios and BENCHMARKS.md from result rows.

The ratio of a case is ours / best other peer, both from rows without error. A case where ours failed
has no ratio and is counted as failed in the summary (it is never dropped silently). BENCHMARKS.md opens
with a status table (the latest run of each work) and keeps every run below it, newest first.
"""
from __future__ import annotations

import math
import os
import re
from pathlib import Path

from .results import load_json

OURS = "autows"
WORK_ORDER = ("gemm", "decode", "attention", "attention-bwd", "fallback", "model", "train")


def _ordered(seq):
    return list(dict.fromkeys(seq))


def impl_order(rows: list[dict], ours: str = OURS) -> list[str]:
    impls = _ordered(r["impl"] for r in rows)
    return [i for i in impls if i != ours] + ([ours] if ours in impls else [])


def rate(row: dict) -> float | None:
    """What a row is compared by, higher is better: its TFLOP/s, or 1/ms for a row that records only a time
    (a run whose FLOPs are not counted, e.g. a multi-GPU step)."""
    if row.get("tflops") is not None:
        return row["tflops"]
    return 1.0 / row["ms"] if row.get("ms") else None


def ok(row: dict | None) -> bool:
    return row is not None and not row.get("error") and rate(row) is not None


def summarize(rows: list[dict], ours: str = OURS) -> list[dict]:
    """Per case (first-appearance order): rows by impl, best other peer, ratio (None if not computable)."""
    out = []
    for case in _ordered(r["case"] for r in rows):
        by_impl = {r["impl"]: r for r in rows if r["case"] == case}
        others = {i: rate(r) for i, r in by_impl.items()  # "<ours>-variant" rows are ours, not peers
                  if i != ours and not i.startswith(f"{ours}-") and ok(r)}
        best = max(others, key=others.get) if others else None
        mine = by_impl.get(ours)
        ratio = rate(mine) / others[best] if ok(mine) and best and others[best] > 0 else None
        if mine is None:
            status = "not run"
        elif not ok(mine):
            status = "failed"
        else:
            status = "ok" if best else "no peer"
        out.append({"case": case, "by_impl": by_impl, "best_other": best,
                    "best_tflops": others.get(best), "ratio": ratio, "status": status})
    return out


def aggregate(summary: list[dict]) -> dict:
    ratios = [(s["ratio"], s["case"]) for s in summary if s["ratio"] is not None]
    res = {"n_ratios": len(ratios), "n_cases": len(summary), "geomean": None, "min": None, "min_case": None,
           "failed": [s["case"] for s in summary if s["status"] == "failed"]}
    if ratios:
        res["geomean"] = math.exp(sum(math.log(r) for r, _ in ratios) / len(ratios))
        res["min"], res["min_case"] = min(ratios)
    return res


def _cell(row: dict | None) -> str:
    if row is None:
        return "-"
    if not ok(row):
        return "FAIL"
    s = f"{row['tflops']:.1f}" if row.get("tflops") is not None else f"{row['ms']:.3f} ms"
    if row.get("spread") is not None:
        s += f" ±{100 * row['spread']:.0f}%"
    return s


def _configs(rows: list[dict], ours: str) -> dict[str, str]:
    """Case -> the config ``ours`` ran it with, where its rows' notes say so (``config <name>``: the attention
    bench); empty when no row does."""
    out = {}
    for r in rows:
        m = re.fullmatch(r"config (\S+)", str(r.get("note") or ""))
        if r["impl"] == ours and m:
            out[r["case"]] = m.group(1)
    return out


def table(rows: list[dict], ours: str = OURS, markdown: bool = False) -> str:
    """TFLOP/s per peer per case, best other peer, ratio (and the config ``ours`` ran each case with, where the
    rows say); then a summary line, the failures and the other notes."""
    impls = impl_order(rows, ours)
    summary = summarize(rows, ours)
    configs = _configs(rows, ours)
    head = ["case", *impls, "best other", f"{ours}/best"] + (["config"] if configs else [])
    body = []
    for s in summary:
        ratio = f"{s['ratio']:.3f}" if s["ratio"] is not None else ("FAIL" if s["status"] == "failed" else "-")
        body.append([s["case"], *(_cell(s["by_impl"].get(i)) for i in impls), s["best_other"] or "-", ratio]
                    + ([configs.get(s["case"], "-")] if configs else []))
    if configs:  # said in the column: not again as notes
        rows = [{**r, "note": None} if r["impl"] == ours and r["case"] in configs else r for r in rows]
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(r) + " |" for r in body]
    else:
        widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]
        fmt = lambda r: "  ".join(str(x).rjust(w) if i else str(x).ljust(w) for i, (x, w) in enumerate(zip(r, widths)))
        lines = [fmt(head), fmt(["-" * w for w in widths])] + [fmt(r) for r in body]
    lines += ["", summary_line(aggregate(summary), ours)]
    for title, key in (("Failures:", "error"), ("Notes:", "note")):
        items = _grouped(rows, key, markdown)
        if items:
            lines += ["", title, ""] if markdown else ["", title]
            lines += items
    split = split_table(rows, markdown)
    if split:
        lines += ["", split]
    return "\n".join(lines)


def _grouped(rows: list[dict], key: str, markdown: bool) -> list[str]:
    """One bullet per (impl, message): ``- case / impl: msg``, or ``- impl on N cases (a, b, ...): msg``."""
    groups: dict[tuple[str, str], list[str]] = {}
    for r in rows:
        if r.get(key):
            groups.setdefault((r["impl"], str(r[key])), []).append(r["case"])
    out = []
    for (impl, msg), cs in groups.items():
        msg = _md_escape(msg) if markdown else msg
        who = f"{cs[0]} / {impl}" if len(cs) == 1 else f"{impl} on {len(cs)} cases ({', '.join(cs)})"
        out.append(f"- {who}: {msg}")
    return out


def summary_line(agg: dict, ours: str = OURS) -> str:
    if agg["geomean"] is None:
        s = f"{ours}/best other: no ratio over {agg['n_cases']} cases"
    else:
        s = (f"{ours}/best other: geomean {agg['geomean']:.3f}, min {agg['min']:.3f} ({agg['min_case']}), "
             f"over {agg['n_ratios']}/{agg['n_cases']} cases")
    if agg["failed"]:
        s += f"; {ours} FAILED on {len(agg['failed'])}: {', '.join(agg['failed'])}"
    return s


def split_table(rows: list[dict], markdown: bool = False) -> str:
    """GPU time per call split into GEMM / attention / rest (model rows with a "split")."""
    srows = [r for r in rows if isinstance(r.get("split"), dict)]
    if not srows:
        return ""
    head = ["case", "impl", "gemm ms", "attention ms", "rest ms", "gemm %", "attention %", "rest %"]
    body = []
    for r in srows:
        sp = r["split"]
        tot = sum(sp.get(k, 0.0) for k in ("gemm_ms", "attention_ms", "rest_ms")) or 1.0
        body.append([r["case"], r["impl"], *(f"{sp.get(k, 0.0):.2f}" for k in ("gemm_ms", "attention_ms", "rest_ms")),
                     *(f"{100 * sp.get(k, 0.0) / tot:.0f}" for k in ("gemm_ms", "attention_ms", "rest_ms"))])
    title = "GPU time per forward by kernel class (torch.profiler, best effort):"
    if markdown:
        lines = [title, "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        return "\n".join(lines + ["| " + " | ".join(b) + " |" for b in body])
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    return "\n".join([title] + ["  ".join(x.rjust(w) for x, w in zip(b, widths)) for b in [head, *body]])


def _md_escape(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


# ---- BENCHMARKS.md ---------------------------------------------------------------------------------

#: ``<date>-<gpu>-<work>[-<n>]``: a work whose name has a dash (attention-bwd) is matched whole; the GPU part is the
#: shortest that lets the rest match, so a dashed GPU slug still works.
_DASHED = "|".join(re.escape(w) for w in WORK_ORDER if "-" in w)
_NAME = re.compile(rf"^(?P<date>\d{{4}}-\d{{2}}-\d{{2}})-(?P<gpu>.+?)-(?P<work>{_DASHED}|[a-z]+)(?:-(?P<n>\d+))?$")


def _file_key(path: Path, meta: dict) -> tuple:
    m = _NAME.match(path.stem)
    n = int(m.group("n")) if m and m.group("n") else 1
    return (meta.get("timestamp") or meta.get("date") or (m.group("date") if m else ""), n, path.name)


def work_of(path: Path, meta: dict) -> str:
    """The work of a result file: its meta's subcommand, else the one in its name."""
    if meta.get("subcommand"):
        return meta["subcommand"]
    m = _NAME.match(path.stem)
    return m.group("work") if m else "other"


def meta_line(meta: dict) -> str:
    gpu = meta.get("gpu") or "no GPU"
    if meta.get("sm_count"):
        gpu += f" ({meta['sm_count']} SMs)"
    clocks = meta.get("clocks")
    if isinstance(clocks, dict) and clocks:
        gpu += ", nvidia-smi before the run: " + ", ".join(
            f"{k.removeprefix('clocks.')} {v}" for k, v in clocks.items())
    parts = [gpu, f"torch {meta.get('torch', '?')}", f"triton {meta.get('triton', '?')}",
             f"commit {meta.get('git_commit') or 'unknown'}"
             + (f" (sources sha256 {meta['source_sha256']})" if meta.get("source_sha256") else ""),
             meta.get("timestamp") or meta.get("date") or "undated"]
    line = "; ".join(parts)
    if meta.get("command"):
        line += f"; `{meta['command']}`"
    if meta.get("complete") is False:
        line += " — **incomplete run**"
    return line


def render_markdown(results_dir: Path, md_path: Path) -> str:
    results_dir, md_path = Path(results_dir), Path(md_path)
    files = sorted(results_dir.glob("*.json")) if results_dir.is_dir() else []
    groups: dict[str, list] = {}
    broken = []
    for f in files:
        try:
            data = load_json(f)
        except (ValueError, OSError) as e:
            broken.append(f"- `{f.name}`: unreadable ({_md_escape(e)})")
            continue
        groups.setdefault(work_of(f, data["meta"]), []).append((f, data))
    order = sorted(groups, key=lambda w: (WORK_ORDER.index(w) if w in WORK_ORDER else 99, w))
    for work in order:
        groups[work].sort(key=lambda fd: _file_key(fd[0], fd[1]["meta"]), reverse=True)
    lines = ["# Benchmarks", "",
             "Generated by `python -m torch_autows.bench report` from every JSON file in "
             f"`{_rel(results_dir, md_path.parent)}`; do not edit by hand. Method, peers, shapes and "
             "correctness rules: `torch_autows/bench/README.md`. TFLOP/s per peer; the ratio is autows / best "
             "other peer in the same process (FAIL: error or over tolerance, never a time).", ""]
    if not groups:
        lines.append("No results yet.")
    else:
        lines += status_table([(w, *groups[w][0]) for w in order], md_path.parent)
    for work in order:
        lines += [f"## {work}", ""]
        for f, data in groups[work]:
            lines += [f"### {f.stem}", "", meta_line(data["meta"]), ""]
            lines.append(table(data["rows"], markdown=True) if data["rows"] else "No rows.")
            png = f.with_suffix(".png")
            links = [f"[JSON]({_rel(f, md_path.parent)})"]
            if png.exists():
                links.append(f"[plot]({_rel(png, md_path.parent)})")
            lines += ["", " · ".join(links), ""]
    if broken:
        lines += ["## Unreadable result files", "", *broken, ""]
    return "\n".join(lines).rstrip() + "\n"


def status_table(latest: list[tuple[str, Path, dict]], md_dir: Path) -> list[str]:
    """The opening table: per work its latest run (linked to its section below), GPU, cases with a ratio,
    geomean and minimum against the best other peer, autows failures; then the latest plots."""
    lines = ["## Status: the latest run of each work", "",
             "| work | latest run | GPU | cases with a ratio | geomean autows/best | min (case) | autows failed |",
             "|---|---|---|---|---|---|---|"]
    plots = []
    for work, f, data in latest:
        agg = aggregate(summarize(data["rows"]))
        meta = data["meta"]
        run = f"[{f.stem}](#{_anchor(f.stem)})" + (" (incomplete)" if meta.get("complete") is False else "")
        geo = f"{agg['geomean']:.3f}" if agg["geomean"] is not None else "-"
        low = f"{agg['min']:.3f} ({agg['min_case']})" if agg["min"] is not None else "-"
        lines.append(f"| {work} | {run} | {meta.get('gpu') or 'no GPU'} | {agg['n_ratios']}/{agg['n_cases']} | "
                     f"{geo} | {low} | {len(agg['failed'])} |")
        png = f.with_suffix(".png")
        if png.exists():
            plots.append(f"![{work}: {f.stem}]({_rel(png, md_dir)})")
    lines += ["", "Each work's runs follow below, newest first; a ratio above 1 is autows ahead. A run's "
              "numbers are comparable only within that run (same process, same GPU).", ""]
    for p in plots:
        lines += [p, ""]
    return lines


def _anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lowercase, punctuation other than - and _ dropped."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def _rel(path: Path, start: Path) -> str:
    return Path(os.path.relpath(Path(path).resolve(), Path(start).resolve())).as_posix()


def write_markdown(results_dir: Path | None = None, md_path: Path | None = None) -> Path:
    """Regenerate BENCHMARKS.md from ``results_dir`` (default ``./bench/results``) at ``md_path`` (default:
    :func:`~torch_autows.bench.results.default_markdown` of the results folder)."""
    from .results import DEFAULT_OUT, default_markdown

    results_dir = Path(results_dir) if results_dir else DEFAULT_OUT
    md_path = Path(md_path) if md_path else default_markdown(results_dir)
    md_path.parent.mkdir(parents=True, exist_ok=True)
    md_path.write_text(render_markdown(results_dir, md_path))
    return md_path
