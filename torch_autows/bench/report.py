"""Tables, ratios and BENCHMARKS.md from result rows.

The ratio of a case is ours / best other peer, both from rows without error. A case where ours failed
has no ratio and is counted as failed in the summary (it is never dropped silently).
"""
from __future__ import annotations

import math
import os
import re
from pathlib import Path

from .results import REPO_ROOT, load_json

OURS = "autows"
WORK_ORDER = ("gemm", "decode", "attention", "model")


def _ordered(seq):
    return list(dict.fromkeys(seq))


def impl_order(rows: list[dict], ours: str = OURS) -> list[str]:
    impls = _ordered(r["impl"] for r in rows)
    return [i for i in impls if i != ours] + ([ours] if ours in impls else [])


def ok(row: dict | None) -> bool:
    return row is not None and not row.get("error") and row.get("tflops") is not None


def summarize(rows: list[dict], ours: str = OURS) -> list[dict]:
    """Per case (first-appearance order): rows by impl, best other peer, ratio (None if not computable)."""
    out = []
    for case in _ordered(r["case"] for r in rows):
        by_impl = {r["impl"]: r for r in rows if r["case"] == case}
        others = {i: r["tflops"] for i, r in by_impl.items()  # "<ours>-variant" rows are ours, not peers
                  if i != ours and not i.startswith(f"{ours}-") and ok(r)}
        best = max(others, key=others.get) if others else None
        mine = by_impl.get(ours)
        ratio = mine["tflops"] / others[best] if ok(mine) and best and others[best] > 0 else None
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
    s = f"{row['tflops']:.1f}"
    if row.get("spread") is not None:
        s += f" ±{100 * row['spread']:.0f}%"
    return s


def table(rows: list[dict], ours: str = OURS, markdown: bool = False) -> str:
    """TFLOP/s per peer per case, best other peer, ratio; then a summary line and the failures."""
    impls = impl_order(rows, ours)
    summary = summarize(rows, ours)
    head = ["case", *impls, "best other", f"{ours}/best"]
    body = []
    for s in summary:
        ratio = f"{s['ratio']:.3f}" if s["ratio"] is not None else ("FAIL" if s["status"] == "failed" else "-")
        body.append([s["case"], *(_cell(s["by_impl"].get(i)) for i in impls), s["best_other"] or "-", ratio])
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(r) + " |" for r in body]
    else:
        widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]
        fmt = lambda r: "  ".join(str(x).rjust(w) if i else str(x).ljust(w) for i, (x, w) in enumerate(zip(r, widths)))
        lines = [fmt(head), fmt(["-" * w for w in widths])] + [fmt(r) for r in body]
    lines += ["", summary_line(aggregate(summary), ours)]
    fails = [r for r in rows if r.get("error")]
    if fails:
        lines += ["", "Failures:", ""] if markdown else ["", "Failures:"]
        lines += [f"- {r['case']} / {r['impl']}: {_md_escape(r['error']) if markdown else r['error']}" for r in fails]
    notes = [r for r in rows if r.get("note")]
    if notes:
        lines += ["", "Notes:", ""] if markdown else ["", "Notes:"]
        lines += [f"- {r['case']} / {r['impl']}: {_md_escape(r['note']) if markdown else r['note']}" for r in notes]
    split = split_table(rows, markdown)
    if split:
        lines += ["", split]
    return "\n".join(lines)


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

_NAME = re.compile(r"^(?P<date>\d{4}-\d{2}-\d{2})-(?P<gpu>.+)-(?P<work>[a-z]+?)(?:-(?P<n>\d+))?$")


def _file_key(path: Path, meta: dict) -> tuple:
    m = _NAME.match(path.stem)
    n = int(m.group("n")) if m and m.group("n") else 1
    return (meta.get("timestamp") or meta.get("date") or (m.group("date") if m else ""), n, path.name)


def _work_of(path: Path, meta: dict) -> str:
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
        gpu += ", nvidia-smi: " + ", ".join(f"{k.removeprefix('clocks.')} {v}" for k, v in clocks.items())
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
        groups.setdefault(_work_of(f, data["meta"]), []).append((f, data))
    lines = ["# Benchmarks", "",
             "Generated by `python -m torch_autows.bench report` from every JSON file in "
             f"`{_rel(results_dir, md_path.parent)}`; do not edit by hand. Method, peers and shapes: "
             "`shared/BENCH.md`. TFLOP/s per peer; the ratio is autows / best other peer in the same process "
             "(FAIL: error or over tolerance, never a time).", ""]
    if not groups:
        lines.append("No results yet.")
    for work in sorted(groups, key=lambda w: (WORK_ORDER.index(w) if w in WORK_ORDER else 99, w)):
        lines += [f"## {work}", ""]
        for f, data in sorted(groups[work], key=lambda fd: _file_key(fd[0], fd[1]["meta"]), reverse=True):
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


def _rel(path: Path, start: Path) -> str:
    return Path(os.path.relpath(Path(path).resolve(), Path(start).resolve())).as_posix()


def write_markdown(results_dir: Path | None = None, md_path: Path | None = None) -> Path:
    from .results import DEFAULT_OUT

    md_path = Path(md_path) if md_path else REPO_ROOT / "BENCHMARKS.md"
    text = render_markdown(Path(results_dir) if results_dir else DEFAULT_OUT, md_path)
    md_path.write_text(text)
    return md_path
