"""Show what torch_autows generates for one problem, step by step:

    python -m torch_autows explain gemm --m 4096 --n 4096 --k 4096 --dtype bf16 [--compile] [--interpret]
    python -m torch_autows explain attention --b 4 --h 16 --s 4096 --d 128 --causal [--compile] [--interpret]
    python -m torch_autows explain attention-bwd --d 128 --causal [--kernel dq] [--compile] [--interpret]

By default it prints the IR after every pipeline stage and the generated Gluon (--stage NAME, --ir and
--gluon select). --compile also compiles the Gluon offline to a sm_90a cubin (no GPU needed) and prints,
as the last line, summary: <json>, with the cubin's path and Triton's cache key. --interpret runs the
program on the CPU interpreter, before and after partitioning, and compares every output with torch.
--sass compiles it as the runtime launches it and prints each Gluon line with the SASS instructions it became.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from dataclasses import replace


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line on stderr (exit status 2), not the whole usage block."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _positive(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def _gemm(args) -> int:
    from .runtime.gemm import CONFIGS, choose_config, serves_swap, swap_serves
    from .runtime.launch import compile_kernel
    from .templates.gemm import GemmRequest

    # as runtime.gemm: a batched GEMM's rows are its batch's rows together, and it never splits K; a few rows in
    # nn.Linear's layout take the swap-AB pick
    swap = swap_serves(trans_a=args.trans_a, trans_b=args.trans_b, batched=args.batch > 1)
    if args.epilogue == "none":
        heuristic = choose_config(args.batch * args.m, args.n, args.k, split=args.batch == 1, swap=swap)
    else:  # the fused epilogues' own runtimes and picks
        CONFIGS, heuristic = _epilogue_configs(args)
    config = args.config or heuristic
    if config not in CONFIGS:
        print(f"unknown config {config!r}; choose one of {sorted(CONFIGS)}", file=sys.stderr)
        return 2
    if args.epilogue == "none" and not serves_swap(config, trans_a=args.trans_a, trans_b=args.trans_b,
                                                   batched=args.batch > 1):
        print(f"config {config!r} is swap-AB: it serves nn.Linear's layout only (--trans-b, no --trans-a, "
              f"batch 1)", file=sys.stderr)
        return 2
    try:
        req = GemmRequest(args.m, args.n, args.k, args.dtype, args.out_dtype, args.trans_a, args.trans_b, args.bias,
                          args.batch, epilogue=args.epilogue)
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    print(f"# request: {req}\n# config: {config} (runtime heuristic: {heuristic})")
    kernel = compile_kernel("gemm", req, CONFIGS[config])
    interp = None
    if args.interpret and args.batch > 2:  # the batch is compiled into the grid: build a smaller twin
        interp = (compile_kernel("gemm", replace(req, batch=2), CONFIGS[config]),
                  f"interpreting a program built for batch=2 instead of {args.batch} (it differs only in the "
                  f"grid's batch extent), to keep the CPU interpreter fast")
    return _show(kernel, args, (args.m, args.n, args.k), interp)


def _epilogue_configs(args) -> tuple[dict, str]:
    """(configs, the runtime's pick) of a fused epilogue: runtime.swiglu's for "swiglu" and "swiglu_save" (the
    training forward's ``SAVE_CONFIG``), runtime.swiglu_bwd's for "swiglu_bwd"."""
    if args.epilogue == "swiglu_bwd":
        from .runtime import swiglu_bwd

        return swiglu_bwd.CONFIGS, swiglu_bwd.PICK
    from .runtime import swiglu

    pick = swiglu.SAVE_CONFIG if args.epilogue == "swiglu_save" else swiglu.choose_config(args.m, args.n, args.k)
    return swiglu.CONFIGS, pick


def _attention(args) -> int:
    from .runtime.attention import (
        CONFIGS,
        HEAD_DIMS,
        UNMASKED_HEAD_DIMS,
        V_HEAD_DIMS,
        choose_config,
        o_tma_ok,
        serves,
        v_head_dims_text,
    )
    from .runtime.launch import compile_kernel
    from .templates.attention import AttentionRequest

    dv = args.dv or args.d
    if dv != args.d and (args.d, dv) not in V_HEAD_DIMS:
        print(f"head dims {args.d}/{dv}: a v head dim of its own is served as {v_head_dims_text()}; "
              f"torch_autows.ops.attention falls back to torch SDPA for others", file=sys.stderr)
        return 2
    config = args.config or choose_config(args.d, args.causal, args.skv or args.s, dv)
    if config not in CONFIGS:
        print(f"unknown config {config!r}; choose one of {sorted(CONFIGS)}", file=sys.stderr)
        return 2
    try:
        req = AttentionRequest(args.d, args.dtype, args.causal, o_tma=o_tma_ok(args.s, dv, CONFIGS[config]),
                               d_v=dv if dv != args.d else 0)
    except ValueError as e:
        print(f"{e}; torch_autows.ops.attention falls back to torch SDPA for it", file=sys.stderr)
        return 2
    if not serves(config, args.d, dv, args.causal):
        if dv == args.d:
            print(f"config {config!r} serves head dims {HEAD_DIMS[config]}"
                  + (f" (without --causal also {UNMASKED_HEAD_DIMS[config]})" if config in UNMASKED_HEAD_DIMS else "")
                  + f", not {args.d}{' with --causal' * args.causal}", file=sys.stderr)
        else:
            print(f"config {config!r} does not serve head dims {args.d}/{dv} (served by {V_HEAD_DIMS[(args.d, dv)]})",
                  file=sys.stderr)
        return 2
    hkv, skv = args.hkv or args.h, args.skv or args.s
    print(f"# problem: B={args.b} Hq={args.h} Hkv={hkv} Sq={args.s} Skv={skv} D={args.d}"
          + (f" Dv={dv}" if dv != args.d else "")
          + f" causal={args.causal} ({args.dtype}); the kernel takes B, heads and lengths at run time")
    print(f"# request: {req}\n# config: {config}")
    return _show(compile_kernel("attention", req, CONFIGS[config]), args, (args.b, args.h, hkv, args.s, skv), None)


def _attention_bwd(args) -> int:
    from .runtime import attention_bwd as rt
    from .runtime.fallback import Unsupported
    from .runtime.launch import compile_kernel
    from .templates.attention_bwd import HEAD_DIMS, AttentionBwdRequest
    from .templates.attention_bwd_dq import AttentionBwdDqRequest

    if args.d not in HEAD_DIMS:
        print(f"head dim {args.d} is not served by the generated backward ({', '.join(map(str, HEAD_DIMS))} are); "
              f"the vendor's backward runs it", file=sys.stderr)
        return 2
    try:  # the runtime's choices for the call, as runtime.attention_bwd.backward makes them
        mode = rt.choose_dq_mode(args.dq_mode, args.d, args.skv or args.s, args.causal)
        config = rt._checked(args.config, args.d, args.causal, mode, args.skv or args.s)
    except (ValueError, Unsupported) as e:
        print(str(e), file=sys.stderr)
        return 2
    hkv, skv = args.hkv or args.h, args.skv or args.s
    print(f"# problem: B={args.b} Hq={args.h} Hkv={hkv} Sq={args.s} Skv={skv} D={args.d} causal={args.causal} "
          f"({args.dtype}); the kernels take B, heads and lengths at run time")
    if args.kernel == "dq":
        if mode != "separate":
            print(f"--kernel dq: the {mode} form has no dQ kernel (dQ is added by the main kernel); "
                  f"use --dq-mode separate", file=sys.stderr)
            return 2
        dq_config = args.dq_config or rt.choose_dq_config(args.d, args.causal)
        if not rt.dq_serves(dq_config, args.d):
            print(f"dQ config {dq_config!r} does not serve head dim {args.d}; use one of "
                  f"{sorted(c for c in rt.DQ_CONFIGS if rt.dq_serves(c, args.d))}", file=sys.stderr)
            return 2
        opts = rt.DQ_CONFIGS[dq_config]
        req = rt.tma_request("attention_bwd_dq", AttentionBwdDqRequest(args.d, args.dtype, args.causal), opts,
                             args.s % opts.block_m == 0, "dq_tma")
        print(f"# request: {req}\n# form: {mode}, the dQ kernel; config: {dq_config}")
        return _show(compile_kernel("attention_bwd_dq", req, opts), args, (args.b, args.h, hkv, args.s, skv), None)
    opts = rt.CONFIGS[config]
    form = "none" if mode == "separate" else mode
    req = rt.tma_request("attention_bwd", AttentionBwdRequest(args.d, args.dtype, args.causal, dq=form), opts,
                         skv % opts.block_n == 0 and form != "atomic", "kv_tma")
    print(f"# request: {req}\n# form: {mode}, the main kernel (dK, dV{'' if form == 'none' else ', dQ'}); "
          f"config: {config}" + ("; --kernel dq shows the dQ kernel" if form == "none" else ""))
    return _show(compile_kernel("attention_bwd", req, opts), args, (args.b, args.h, hkv, args.s, skv), None)


def _show(kernel, args, shape, interp) -> int:
    """Print what the flags ask for of ``kernel`` (runtime.launch.Kernel: the pipeline's trace, every stage
    verified here); ``interp``: (Kernel, note) to interpret instead of ``kernel``, or None."""
    from . import verify
    from .codegen import gluon
    from .ir import format_program

    trace, program = kernel.trace, kernel.program
    for name, p in trace:
        verify.check(p, name)
    show_ir = args.ir or args.stage is not None or not args.gluon
    show_gluon = args.gluon or (not args.ir and args.stage is None)
    if show_ir:
        for name, p in trace:
            if args.stage in (None, name):
                print(f"\n# ---- IR after {name} ----")
                print(format_program(p), end="")
    if show_gluon:
        print("\n# ---- generated Gluon ----")
        print(gluon.generate(program), end="")
    if args.interpret:
        from .interp import interpret_report
        from .interp.report import fit_shape

        before, after, notes = trace[0][1], program, []
        if interp is not None:
            before, after = interp[0].trace[0][1], interp[0].program
            for name, p in interp[0].trace:
                verify.check(p, name)
            notes.append(interp[1])
        shape, note = fit_shape(after, shape)
        notes += [note] if note else []
        ok, report = interpret_report(before, after, seeds=args.seeds, shape=shape)
        print("\n# ---- CPU interpreter ----")
        for n in notes:
            print(f"note: {n}")
        print(report)
        if not ok:
            return 1
    if args.sass:
        _sass(program)
    if args.compile:
        from .codegen.compile import compile_offline, summary

        kernel = compile_offline(program)
        info = summary(program, kernel)
        info["cubin"] = _cubin_path(kernel, args.out)
        info["cache_key"] = kernel.hash
        for why in info["wgmma_serialized"]:  # ptxas waits for every wgmma at its issue: no mma overlaps anything
            print(f"warning: ptxas serializes this kernel's wgmma {why}", file=sys.stderr)
        print("summary: " + json.dumps(info))
    return 0


def _sass(program) -> None:
    """The generated Gluon with, left of each line, the SASS instructions the kernel compiled as the runtime launches
    it (integers divisible by 16, aligned pointers) spends on it; then each partition's total."""
    from .codegen import gluon
    from .codegen.compile import compile_as_launched, sass_per_line

    counts = sass_per_line(program, compile_as_launched(program))
    print("\n# ---- SASS instructions per line (sm_90a, compiled as launched) ----")
    totals, part = {}, None
    for i, text in enumerate(gluon.generate(program).splitlines(), 1):
        m = re.match(r"def (\w+)\(", text)
        part = m.group(1) if m else part
        n = counts.get(i, 0)
        if part is not None and n:
            totals[part] = totals.get(part, 0) + n
        print(f"{n or '':>6}  {text}")
    print("# totals: " + ", ".join(f"{p} {n}" for p, n in totals.items())
          + (f", in triton's library functions {counts[0]}" if counts.get(0) else ""))


def _cubin_path(kernel, out: str | None) -> str | None:
    """Where the cubin lies: a copy under ``out`` when given, else the file in Triton's cache (None if the
    cache keeps no local file, e.g. a remote cache manager)."""
    name = f"{kernel.name}.cubin"
    if out is not None:
        os.makedirs(out, exist_ok=True)
        path = os.path.join(out, name)
        with open(path, "wb") as f:
            f.write(kernel.asm["cubin"])
        return os.path.abspath(path)
    path = getattr(kernel, "metadata_group", {}).get(name)
    return path if path and os.path.isfile(path) else None


def _attention_problem(p: argparse.ArgumentParser, head_dims: str) -> None:
    """The attention problem's arguments (the forward's and the backward's subcommands take the same)."""
    p.add_argument("--b", type=_positive, default=1, help="batch (default: 1)")
    p.add_argument("--h", type=_positive, default=16, help="query heads (default: 16)")
    p.add_argument("--hkv", type=_positive, default=None, help="key/value heads (GQA), a divisor of --h; "
                                                               "default: --h")
    p.add_argument("--s", type=_positive, default=4096, help="query length (default: 4096)")
    p.add_argument("--skv", type=_positive, default=None, help="key/value length; default: --s")
    p.add_argument("--d", type=_positive, default=128, help=f"head dim: {head_dims} (default: 128)")
    p.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16", help="dtype of q, k, v (default: bf16)")
    p.add_argument("--causal", action="store_true", help="causal mask, top-left aligned like SDPA's is_causal")


def _parser() -> _Parser:
    from ._version import __version__
    from .passes.pipeline import STAGES
    from .runtime import attention as rt_attention
    from .runtime import attention_bwd as rt_bwd
    from .runtime import gemm as rt_gemm
    from .templates.gemm import EPILOGUES

    stages = list(STAGES)
    ap = _Parser(prog="python -m torch_autows", description=__doc__,
                 formatter_class=argparse.RawDescriptionHelpFormatter)
    import torch
    import triton

    ap.add_argument("--version", action="version",
                    version=f"torch_autows {__version__} (torch {torch.__version__}, triton {triton.__version__})")
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="explain", title="command")
    ex = sub.add_parser("explain", help="show the compiler: IR after each pass, the Gluon, optionally compile",
                        description="Show the IR after each pipeline stage and the generated Gluon for one problem.")
    kinds = ex.add_subparsers(dest="kind", required=True, metavar="{gemm,attention,attention-bwd}", title="problem")
    g = kinds.add_parser("gemm", help="C = A @ B (+ bias)", description="C = A @ B (+ bias), optionally batched.")
    g.add_argument("--m", type=_positive, required=True, help="rows of A and C")
    g.add_argument("--n", type=_positive, required=True, help="columns of B and C")
    g.add_argument("--k", type=_positive, required=True, help="columns of A, rows of B (the reduction)")
    g.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16", help="operand dtype (default: bf16)")
    g.add_argument("--out-dtype", choices=["bf16", "fp16", "f32"], default=None,
                   help="output dtype (default: the operand dtype)")
    g.add_argument("--trans-a", action="store_true", help="A is a transposed (column-major) view")
    g.add_argument("--trans-b", action="store_true", help="B is a transposed (column-major) view")
    g.add_argument("--bias", action="store_true", help="add a bias vector of length N to every row")
    g.add_argument("--batch", type=_positive, default=1, help="number of independent GEMMs (bmm; default: 1)")
    g.add_argument("--epilogue", choices=EPILOGUES, default="none",
                   help="a fused epilogue: swiglu (silu(A @ B) * (A @ Bu), the Llama MLP's gate and up), swiglu_save "
                        "(the same in a training graph: G and U stored too), swiglu_bwd (the MLP backward's dh GEMM: "
                        "dG and du from the saved G and U); default: none")
    g.add_argument("--config", default=None, help=f"runtime config name, one of {', '.join(rt_gemm.CONFIGS)} "
                                                  f"(default: the runtime heuristic's pick)")
    a = kinds.add_parser("attention", help="flash-attention forward, SDPA semantics, with lse",
                         description="Flash-attention forward (SDPA semantics), also returning the logsumexp.")
    _attention_problem(a, "64, 96, 128, 192 or 256")
    a.add_argument("--dv", type=_positive, default=None,
                   help="head dim of v and the output where it differs from --d: "
                        + rt_attention.v_head_dims_text() + " (default: --d)")
    pairs = {c: f"{d}/{dv}" for (d, dv), cs in rt_attention.V_HEAD_DIMS.items() for c in cs}
    dims = {c: "/".join(map(str, ds)) for c, ds in rt_attention.HEAD_DIMS.items()}
    for c, ds in rt_attention.UNMASKED_HEAD_DIMS.items():
        dims[c] = ", ".join(filter(None, (dims[c], "/".join(map(str, ds)) + " without the mask")))
    names = [f"{c} (d={dims[c] or pairs.get(c, '')})" for c in rt_attention.CONFIGS]
    a.add_argument("--config", default=None, help=f"runtime config name, one of {', '.join(names)} "
                                                   f"(default: the runtime heuristic's pick)")
    w = kinds.add_parser("attention-bwd", help="the generated attention backward: its main kernel or its dQ kernel",
                         description="The generated attention backward (dK, dV and dQ of the forward above), in the "
                                     "form and configs the runtime picks: the main kernel (one CTA per block of keys), "
                                     "or with --kernel dq the separate form's dQ kernel.")
    _attention_problem(w, "64 or 128")
    w.add_argument("--dq-mode", choices=["separate", "reduce", "atomic"], default=None,
                   help="how dQ is made (default: the runtime's pick for the head dim)")
    w.add_argument("--kernel", choices=["main", "dq"], default="main",
                   help="which kernel to show: the main one (default) or the separate form's dQ kernel")
    w.add_argument("--config", default=None, help=f"the main kernel's runtime config, one of "
                                                   f"{', '.join(rt_bwd.CONFIGS)} (default: the runtime's pick)")
    w.add_argument("--dq-config", default=None, help=f"the dQ kernel's runtime config, one of "
                                                      f"{', '.join(rt_bwd.DQ_CONFIGS)} (default: the runtime's pick)")
    for p in (g, a, w):
        p.set_defaults(parser=p)  # main() reports cross-argument errors through the subcommand's parser
        out = p.add_argument_group("output and checks")
        out.add_argument("--stage", choices=stages, default=None, metavar="NAME",
                         help=f"print only the IR after this pipeline stage: {', '.join(stages)}")
        out.add_argument("--ir", action="store_true", help="print the IR (every stage, or --stage's)")
        out.add_argument("--gluon", action="store_true", help="print the generated Gluon "
                                                              "(default, without --ir/--gluon/--stage: IR and Gluon)")
        out.add_argument("--compile", action="store_true",
                         help="compile offline to a sm_90a cubin (no GPU needed) and print a JSON summary as the "
                              "last line, with the cubin's path and Triton's cache key")
        out.add_argument("--sass", action="store_true",
                         help="compile for sm_90a as the runtime launches it (no GPU needed) and print the generated "
                              "Gluon with the SASS instructions each line became, and each partition's total")
        out.add_argument("--out", metavar="DIR", default=None,
                         help="with --compile: also write the cubin to DIR and report that path")
        out.add_argument("--interpret", action="store_true",
                         help="run the program on the CPU interpreter before and after partitioning and compare "
                              "with torch; on the requested shape if it is small, else on a shrunk one (said so)")
        out.add_argument("--seeds", type=_positive, default=4,
                         help="random instances (values, layouts) per scheduling policy for --interpret (default: 4)")
    return ap


def main(argv=None) -> int:
    """The CLI; returns the exit status (usage errors exit with status 2)."""
    ap = _parser()
    args = ap.parse_args(argv)
    sub = args.parser
    if args.out is not None and not args.compile:
        sub.error("--out DIR needs --compile")
    if args.kind == "gemm":
        return _gemm(args)
    if args.hkv is not None and args.h % args.hkv:
        sub.error(f"--hkv {args.hkv} must divide --h {args.h} (each key/value head serves --h/--hkv query heads)")
    return _attention_bwd(args) if args.kind == "attention-bwd" else _attention(args)


if __name__ == "__main__":
    sys.exit(main())
