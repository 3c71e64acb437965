"""``python -m torch_autows.bench {gemm,attention,attention-bwd,model,decode,fallback,train,report}``: measure autows
against its peers.

    python -m torch_autows.bench gemm --quick                 # a few shapes, all peers
    python -m torch_autows.bench attention --cases 's4096-*' --repeat 3
    python -m torch_autows.bench attention-bwd --quick        # dQ, dK, dV against cuDNN's and FA2's backward
    python -m torch_autows.bench model --cases 8x2048 --peers inductor,autows
    python -m torch_autows.bench gemm --dry-run               # list cases and peers; needs no GPU
    python -m torch_autows.bench report                       # only regenerate BENCHMARKS.md and the plots

Each run writes <out>/<date>-<gpu>-<work>.json (rewritten after every case, so a killed run keeps what
it measured) and a PNG next to it (needs matplotlib: pip install 'torch_autows[bench]'), prints the
table, and regenerates BENCHMARKS.md from every result in <out>. <out> defaults to ./bench/results under
the current directory; BENCHMARKS.md goes to <root>/BENCHMARKS.md for <root>/bench/results, else next to
<out>. Nothing is written inside the installed package. Method, peers, shapes and correctness rules:
torch_autows/bench/README.md.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import cases as _cases
from .results import DEFAULT_OUT, default_markdown

WORKS = ("gemm", "attention", "attention-bwd", "model", "decode", "fallback", "train")
#: Timing defaults per work: a model forward takes ~50 ms, so do_bench's default 100 ms would time it
#: twice; measured on the H200, 1 round of that put max-autotune 8% ahead of Inductor default, 3 rounds of
#: 1 s put them within 1% (model-6 against model-7).
TIMING = {"gemm": (1, 25, 100), "attention": (1, 25, 100), "attention-bwd": (1, 25, 100), "model": (3, 200, 1000),
          "decode": (3, 10, 50), "fallback": (3, 25, 100), "train": (3, 200, 1000)}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m torch_autows.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    for work in WORKS:
        s = sub.add_parser(work, help=f"benchmark {work}")
        s.add_argument("--quick", action="store_true", help="a small subset of the cases")
        s.add_argument("--shapes", "--cases", dest="cases", default=None,
                       help="comma-separated case names or globs (see --dry-run for the names)")
        s.add_argument("--peers", default=None, help="comma-separated peer names (default: all)")
        repeat, warmup, rep = TIMING[work]
        s.add_argument("--repeat", type=int, default=repeat, help="timing rounds per peer; records the spread")
        s.add_argument("--warmup", type=int, default=warmup, help="do_bench warmup (ms)")
        s.add_argument("--rep", type=int, default=rep, help="do_bench rep (ms)")
        _output_args(s)
        s.add_argument("--no-report", action="store_true", help="do not regenerate BENCHMARKS.md")
        s.add_argument("--dry-run", action="store_true", help="list cases and peers; measure nothing")
        if work in ("model", "train"):
            s.add_argument("--layers", type=int, default=4, help="decoder layers (default 4)")
    r = sub.add_parser("report", help="regenerate BENCHMARKS.md and the PNG plots from every JSON file in --out")
    _output_args(r)
    r.add_argument("--no-plots", action="store_true", help="regenerate BENCHMARKS.md only, not the PNGs")
    return p


def _output_args(s: argparse.ArgumentParser) -> None:
    s.add_argument("--out", type=Path, default=DEFAULT_OUT,
                   help="results folder (default: ./bench/results under the current directory)")
    s.add_argument("--markdown", "--md", dest="md", type=Path, default=None,
                   help="BENCHMARKS.md path (default: <root>/BENCHMARKS.md for <root>/bench/results, "
                        "else next to --out)")


def _split(text: str | None) -> list[str] | None:
    return [x.strip() for x in text.split(",") if x.strip()] if text else None


def peers_of(work: str):
    if work == "gemm":
        from . import peers_gemm as mod
    elif work == "attention":
        from . import peers_attention as mod
    elif work == "attention-bwd":
        from . import peers_attention_bwd as mod
    elif work == "decode":
        from . import peers_decode as mod
    elif work == "fallback":
        from . import peers_fallback as mod
    elif work == "train":
        from . import train as mod
    else:
        from . import model as mod
    peers, notes = mod.all_peers()
    return mod, peers, notes


def pick_peers(peers: list, notes: list[str], names: list[str] | None) -> list:
    if not names:
        return peers
    by_name = {p.name: p for p in peers}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise ValueError(f"unknown or unavailable peer(s) {', '.join(unknown)}; available: "
                         f"{', '.join(by_name)}" + (f" ({'; '.join(notes)})" if notes else ""))
    return [p for p in peers if p.name in names]


def dry_run(work: str, selected: list, peers: list, notes: list[str], args) -> None:
    print(f"{work}: {len(selected)} case(s), {len(peers)} peer(s) — dry run, nothing is measured")
    print("cases:")
    width = max((len(c.name) for c in selected), default=0)
    for c in selected:
        print(f"  {c.name.ljust(width)}  {c.describe()}  ({c.flops / 1e9:,.1f} GFLOP)")
    print("peers:")
    pw = max((len(p.name) for p in peers), default=0)
    for p in peers:
        print(f"  {p.name.ljust(pw)}  {p.about}")
    for n in notes:
        print(f"note: {n}")
    print(f"timing: triton.testing.do_bench(warmup={args.warmup}, rep={args.rep}, return_mode='median') "
          f"x {args.repeat} round(s)")
    print(f"output: {args.out}/<date>-<gpu>-{work}.json + .png; then {args.md or default_markdown(args.out)}")


def _setup_torch() -> None:
    import torch
    import torch._dynamo

    torch.backends.cuda.matmul.allow_tf32 = False
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(64, getattr(torch._dynamo.config, name)))


def _reset_dynamo() -> None:
    import torch._dynamo

    torch._dynamo.reset()


def run(work: str, selected: list, peers: list, notes: list[str], args, argv: list[str]) -> int:
    import torch

    from .plot import try_plot
    from .report import table, write_markdown
    from .results import collect_meta, result_path, write_json
    from .runner import progress, run_suite

    if not torch.cuda.is_available():
        print("error: no CUDA device; use --dry-run to list the cases without one", file=sys.stderr)
        return 2
    _setup_torch()
    mod = peers_of(work)[0]
    suite = mod.suite(selected, peers)
    suite.before_case = _reset_dynamo
    meta = collect_meta(work, argv, cases=[c.name for c in selected], peers=[p.name for p in peers],
                        skipped_peers=notes, repeat=args.repeat, warmup_ms=args.warmup, rep_ms=args.rep,
                        quick=args.quick, complete=False)
    if hasattr(mod, "run_meta"):  # e.g. decode: the copy ceiling of this run
        meta.update(mod.run_meta())
    path = result_path(Path(args.out), meta["date"], meta["gpu"], work)
    progress(f"{work}: {len(selected)} case(s) x {len(peers)} peer(s) on {meta['gpu']} -> {path}")
    for n in notes:
        progress(f"note: {n}")
    rows: list[dict] = []

    def save(rows_so_far):
        rows[:] = rows_so_far
        write_json(path, meta, rows)

    try:
        run_suite(suite, repeat=args.repeat, warmup=args.warmup, rep=args.rep, on_case=save)
        meta["complete"] = True
    except KeyboardInterrupt:
        progress("interrupted: writing what was measured")
    write_json(path, meta, rows)
    print(table(rows))
    png = try_plot(rows, path.with_suffix(".png"), work=work, title=f"{path.stem}: {meta['gpu']}", note=progress)
    progress(f"wrote {path}" + (f" and {png}" if png else ""))
    if not args.no_report:
        progress(f"wrote {write_markdown(Path(args.out), args.md)}")
    return 0 if meta["complete"] else 130


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.cmd == "report":
        from .plot import regenerate_plots
        from .report import write_markdown

        if not args.no_plots:
            regenerate_plots(args.out, note=lambda msg: print(msg, file=sys.stderr))
        print(write_markdown(args.out, args.md))
        return 0
    try:
        selected = _cases.select(args.cmd, _split(args.cases), args.quick)
        if args.cmd in ("model", "train") and args.layers != 4:
            import dataclasses

            selected = [dataclasses.replace(c, layers=args.layers) for c in selected]
        _, peers, notes = peers_of(args.cmd)
        peers = pick_peers(peers, notes, _split(args.peers))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.repeat < 1:
        print("error: --repeat must be >= 1", file=sys.stderr)
        return 2
    if args.dry_run:
        dry_run(args.cmd, selected, peers, notes, args)
        return 0
    return run(args.cmd, selected, peers, notes, args, argv)


if __name__ == "__main__":
    sys.exit(main())
