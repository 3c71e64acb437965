"""``python -m torch_autows explain gemm --m 4096 --n 4096 --k 4096 --dtype bf16 [--compile] [--interpret]``
``python -m torch_autows explain attention --b 4 --h 16 --s 4096 --d 128 --causal [--compile] [--interpret]``

Prints the IR after every pipeline step and the generated Gluon; with ``--compile`` also compiles it
offline to a sm_90a cubin (no GPU needed) and prints, as the last line, ``summary: <json>``.
"""
from __future__ import annotations

import argparse
import json
import sys


def _gemm(args) -> int:
    from .codegen import gluon
    from .ir import format_program
    from .passes import pipeline
    from .runtime.gemm import CONFIGS, choose_config
    from .templates.gemm import GemmRequest, build

    config = args.config or choose_config(args.m, args.n, args.k)
    if config not in CONFIGS:
        print(f"unknown config {config!r}; choose one of {sorted(CONFIGS)}", file=sys.stderr)
        return 2
    req = GemmRequest(args.m, args.n, args.k, args.dtype, args.out_dtype, args.trans_a, args.trans_b, args.bias,
                      args.batch)
    print(f"# request: {req}\n# config: {config} (runtime heuristic: {choose_config(args.m, args.n, args.k)})")
    return _show(build(req, CONFIGS[config]), args, pipeline, format_program, gluon)


def _attention(args) -> int:
    from .codegen import gluon
    from .ir import format_program
    from .passes import pipeline
    from .runtime.attention import CONFIGS, HEAD_DIMS, choose_config, serves
    from .templates.attention import AttentionRequest, build

    config = args.config or choose_config(args.d, args.causal, args.skv or args.s)
    if config not in CONFIGS:
        print(f"unknown config {config!r}; choose one of {sorted(CONFIGS)}", file=sys.stderr)
        return 2
    try:
        req = AttentionRequest(args.d, args.dtype, args.causal)
    except ValueError as e:
        print(f"{e}; torch_autows.ops.attention falls back to torch SDPA for it", file=sys.stderr)
        return 2
    if not serves(config, args.d):
        print(f"config {config!r} serves head dims {HEAD_DIMS[config]}, not {args.d}", file=sys.stderr)
        return 2
    hkv = args.hkv or args.h
    print(f"# problem: B={args.b} Hq={args.h} Hkv={hkv} Sq={args.s} Skv={args.skv or args.s} D={args.d} "
          f"causal={args.causal} ({args.dtype}); the kernel takes B, heads and lengths at run time")
    print(f"# request: {req}\n# config: {config}")
    return _show(build(req, CONFIGS[config]), args, pipeline, format_program, gluon)


def _show(program, args, pipeline, format_program, gluon) -> int:
    trace: list = []
    program = pipeline.run(program, verify=True, trace=trace)
    for name, p in trace:
        print(f"\n# ---- IR after {name} ----")
        print(format_program(p), end="")
    print("\n# ---- generated Gluon ----")
    print(gluon.generate(program), end="")
    if getattr(args, "interpret", False):
        from .interp import interpret_report

        ok, report = interpret_report(trace[0][1], program, seeds=args.seeds)
        print("\n# ---- CPU interpreter ----")
        print(report)
        if not ok:
            return 1
    if args.compile:
        from .codegen.compile import compile_offline, summary

        kernel = compile_offline(program)
        print("summary: " + json.dumps(summary(program, kernel)))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m torch_autows", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    ex = sub.add_parser("explain", help="show the compiler: IR after each pass, the Gluon, optionally compile")
    kinds = ex.add_subparsers(dest="kind", required=True)
    g = kinds.add_parser("gemm", help="C = A @ B (+ bias)")
    g.add_argument("--m", type=int, required=True)
    g.add_argument("--n", type=int, required=True)
    g.add_argument("--k", type=int, required=True)
    g.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    g.add_argument("--out-dtype", choices=["bf16", "fp16", "f32"], default=None)
    g.add_argument("--trans-a", action="store_true", help="A is a transposed (column-major) view")
    g.add_argument("--trans-b", action="store_true", help="B is a transposed (column-major) view")
    g.add_argument("--bias", action="store_true")
    g.add_argument("--batch", type=int, default=1)
    g.add_argument("--config", default=None, help="runtime config name (default: the heuristic's pick)")
    a = kinds.add_parser("attention", help="flash-attention forward, SDPA semantics, with lse")
    a.add_argument("--b", type=int, default=1)
    a.add_argument("--h", type=int, default=16, help="query heads")
    a.add_argument("--hkv", type=int, default=None, help="key/value heads (GQA); default: --h")
    a.add_argument("--s", type=int, default=4096, help="query length")
    a.add_argument("--skv", type=int, default=None, help="key/value length; default: --s")
    a.add_argument("--d", type=int, default=128)
    a.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    a.add_argument("--causal", action="store_true")
    a.add_argument("--config", default=None)
    for p in (g, a):
        p.add_argument("--compile", action="store_true", help="compile offline to a sm_90a cubin and summarize")
        p.add_argument("--interpret", action="store_true",
                       help="run the program on the CPU interpreter, before and after partitioning")
        p.add_argument("--seeds", type=int, default=4, help="interleavings per scheduling policy (--interpret)")
    args = ap.parse_args(argv)
    return _gemm(args) if args.kind == "gemm" else _attention(args)


if __name__ == "__main__":
    sys.exit(main())
