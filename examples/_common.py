"""Shared harness of the example scripts: eager vs ``torch.compile`` (Inductor) vs ``backend="autows"``.

For each variant it prints the max error against an fp32 eager copy of the model (same weights, rounded
to the run's dtype: the error is the computation's, not the weights' rounding). On an sm_90 GPU it also
times each variant with ``torch.utils.benchmark.Timer(...).blocked_autorange()`` and prints the median
time per step with its spread (interquartile range), and the autows / Inductor speedup. On a CPU (or
another GPU) the generated kernels cannot run: autows runs torch, so nothing is timed and no speedup is
printed.

What autows did is counted at run time (``torch_autows.runtime.fallback.counters``, reset before the
measured steps): calls per step served by generated kernels and calls that fell back to torch, with the
reasons. The sites the compiler rewrote or left to Inductor are counted while the autows variant
compiles, with the FX-graph and AOTAutograd caches off for that compile (a cache hit skips the passes
that count), so they are the same whether or not an earlier run left a cached graph.
"""
from __future__ import annotations

import argparse
import copy
import sys

import torch

import torch_autows  # noqa: F401  (registers backend="autows" where the package is not pip-installed)


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                   help="cuda or cpu (default: cuda when a GPU is visible)")
    p.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default=None,
                   help="default: bf16 on CUDA, fp32 on CPU")
    p.add_argument("--batch", type=int, default=None, help="batch size (default: per device)")
    p.add_argument("--seq", type=int, default=None, help="sequence length (default: per device)")
    p.add_argument("--layers", type=int, default=2, help="stacked layers (default 2)")
    p.add_argument("--min-time", type=float, default=1.0,
                   help="seconds of timed steps per variant on the GPU (blocked_autorange's min_run_time)")
    p.add_argument("--train", action="store_true", help="time forward + backward")
    p.add_argument("--mode", default=None, help="torch.compile mode for both compiled variants")
    p.add_argument("--dynamic", action="store_true", help="mark the sequence length dynamic")
    return p


def finish(args: argparse.Namespace, cuda_defaults: dict, cpu_defaults: dict) -> argparse.Namespace:
    """Fill size defaults by device (small on CPU, where autows falls back and says so); refuse a CUDA
    device this torch cannot use with a message instead of torch's assertion."""
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        why = ("this torch is a CPU-only build" if torch.version.cuda is None
               else "no CUDA GPU is visible to it")
        sys.exit(f"error: --device {args.device}: {why}; run with --device cpu (autows then falls back to torch "
                 "and says why), or on a machine with an sm_90 GPU and a CUDA build of torch")
    defaults = cuda_defaults if args.device.startswith("cuda") else cpu_defaults
    for k, v in defaults.items():
        if getattr(args, k, None) is None:
            setattr(args, k, v)
    if args.dtype is None:
        args.dtype = "bf16" if args.device.startswith("cuda") else "fp32"
    return args


DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def hidden_states(args: argparse.Namespace):
    """``make_inputs`` for a stack of blocks: one [batch, seq, dim] activation (with grad when training)."""
    return lambda device, dtype: [torch.randn(args.batch, args.seq, args.dim, device=device, dtype=dtype,
                                              requires_grad=args.train)]


def _step(fn, inputs, train: bool):
    if not train:
        with torch.no_grad():
            return fn(*inputs)
    for t in [*inputs, *fn.parameters()]:  # a training step starts from cleared grads (CUDA graphs need it:
        t.grad = None                        # accumulating reads a graph output a later replay overwrote)
    out = fn(*inputs)
    out = out[0] if isinstance(out, tuple) else getattr(out, "logits", out)
    out.float().square().mean().backward()
    return out.detach()


def _logits(out):
    out = out[0] if isinstance(out, tuple) else out
    return getattr(out, "logits", out)


def can_run_generated(device: str) -> str | None:
    """None where the generated kernels can run on ``device``, else why not (one sentence)."""
    if not device.startswith("cuda"):
        return (f"tensors on {device}: the generated kernels need an NVIDIA sm_90 (Hopper) GPU, so autows "
                "runs torch here and nothing is timed (no speedup to report)")
    major, minor = torch.cuda.get_device_capability(torch.device(device))
    if (major, minor) != (9, 0):
        return (f"{torch.cuda.get_device_name(torch.device(device))} is sm_{major}{minor}: the generated kernels "
                "need sm_90 (Hopper), so autows runs torch here and nothing is timed")
    return None


def no_graph_caches():
    """Inductor's FX-graph cache and AOTAutograd's cache off: a hit skips the compiler passes, and with them
    the site counts and reasons autows reports."""
    import contextlib

    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    stack = contextlib.ExitStack()
    stack.enter_context(inductor_config.patch(fx_graph_cache=False, fx_graph_remote_cache=False))
    stack.enter_context(functorch_config.patch(enable_autograd_cache=False))
    return stack


def _measure(fn, inputs, args):
    """``blocked_autorange`` over whole steps: (Measurement, steps run), counting steps for the call counters."""
    from torch.utils.benchmark import Timer

    steps = [0]

    def step():
        steps[0] += 1
        _step(fn, inputs, args.train)

    m = Timer(stmt="step()", globals={"step": step}, label="ms/step").blocked_autorange(min_run_time=args.min_time)
    return m, steps[0]


def run(name: str, make_model, make_inputs, args: argparse.Namespace) -> None:
    """Compare eager, Inductor and autows on ``make_model()`` (fp32, on CPU) and ``make_inputs(device, dtype)``."""
    from torch_autows.inductor import support
    from torch_autows.runtime import fallback

    dtype = DTYPES[args.dtype]
    torch.manual_seed(0)
    base = make_model().eval()
    for p in base.parameters():  # the weights a bf16 checkpoint holds: the fp32 reference computes with these
        p.data = p.data.to(dtype).float()  # same values, so the error measured is the computation's
    ref_model = copy.deepcopy(base).to(args.device)
    model = copy.deepcopy(base).to(args.device)
    for p in model.parameters():  # parameters only, as loading a checkpoint in bf16 does: `.to(dtype)` would
        p.data = p.data.to(dtype)  # also round float buffers such as Llama's RoPE inv_freq (positions drift)
    if args.train:
        model.train()
    inputs = make_inputs(args.device, dtype)
    if args.dynamic:
        for t in inputs:
            if t.dim() >= 2:
                torch._dynamo.mark_dynamic(t, 1)
    with torch.no_grad():
        ref = _logits(ref_model(*[t if not t.is_floating_point() else t.float() for t in inputs])).float()

    print(f"{name}: device={args.device} dtype={args.dtype} train={args.train} mode={args.mode or 'default'} "
          f"torch {torch.__version__} torch_autows {torch_autows.__version__}")
    not_here = can_run_generated(args.device)
    if not_here:
        print(f"note: {not_here}")
    rows = []
    for label, fn in (("eager", model),
                      ("inductor", torch.compile(model, mode=args.mode)),
                      ("autows", torch.compile(model, backend="autows", mode=args.mode))):
        if label == "autows":
            support.reset()
            fallback.reset()
            with no_graph_caches():  # so the compile-time counts are made on every run
                out = _step(fn, inputs, args.train)
            sites = dict(support.site_counters)
        else:
            out = _step(fn, inputs, args.train)  # compile + warm-up
        out = _logits(_step(fn, inputs, args.train))  # CUDA graphs record on a later call
        fallback.counters.clear()  # count the measured steps only
        if not_here:
            out, m, steps = _logits(_step(fn, inputs, args.train)), None, 1
        else:
            m, steps = _measure(fn, inputs, args)
        if label == "autows":
            calls = {k: v / steps for k, v in fallback.counters.items()}
            why = sorted({r for _, r in fallback._logged} | {r for _, r in support._logged})
        diff = out.float() - ref
        rows.append((label, m, diff.abs().max().item(), (diff.norm() / ref.norm()).item()))
    _report(rows, sites, calls, why, args, timed=not not_here)


def _report(rows, sites: dict, calls: dict, why: list[str], args, timed: bool) -> None:
    if timed:
        print(f"{'variant':<10}{'ms/step':>12}{'IQR ms':>10}{'runs':>6}{'max |err| vs fp32 eager':>28}"
              f"{'rel err (norm)':>16}")
        for label, m, err, rel in rows:
            print(f"{label:<10}{m.median * 1e3:>12.3f}{m.iqr * 1e3:>10.3f}{len(m.times):>6}{err:>28.3e}{rel:>16.3e}")
    else:
        print(f"{'variant':<10}{'max |err| vs fp32 eager':>28}{'rel err (norm)':>16}")
        for label, _, err, rel in rows:
            print(f"{label:<10}{err:>28.3e}{rel:>16.3e}")
    served_any = False
    for op, kinds in (("attention", ("attention",)), ("gemm", ("gemm", "bmm"))):
        served = sum(calls.get(f"{k}.autows", 0) for k in kinds)
        fell = sum(calls.get(f"{k}.fallback", 0) for k in kinds)
        served_any |= served > 0
        print(f"autows {op:<9}: per step {served:g} call(s) served by generated kernels, {fell:g} fell back to "
              f"torch; compiled: {sites.get(f'{op}.rewritten', 0)} site(s) rewritten, "
              f"{sites.get(f'{op}.left', 0)} left to Inductor")
    if args.mode in ("reduce-overhead", "max-autotune"):  # the modes that use CUDA graphs
        print("  (CUDA-graph replays run no Python, so calls are counted only where a step is not replayed)")
    if sites.get("gemm.choice"):
        print(f"autows gemm      : offered as an autotuning choice at {sites['gemm.choice']} site(s)")
    for r in why:
        print(f"  why not autows: {r}")
    if timed:
        ind, aws = rows[1][1], rows[2][1]
        if served_any or args.mode in ("reduce-overhead", "max-autotune"):
            print(f"{'speedup autows vs inductor':<30}{ind.median / aws.median:>8.2f}x  (medians; IQR "
                  f"inductor {100 * ind.iqr / ind.median:.1f}%, autows {100 * aws.iqr / aws.median:.1f}%)")
        else:
            print("no speedup reported: no call ran a generated kernel (see the reasons above)")
