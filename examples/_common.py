"""Shared harness of the example scripts: eager vs ``torch.compile`` (Inductor) vs ``backend="autows"``.

For each variant it prints the time per step, the max error against an fp32 eager copy of the model (same
weights, rounded to the run's dtype: the error is the computation's, not the weights' rounding) and,
for autows, how many sites it rewrote at compile time and how many calls its kernels served in one step
(``torch_autows.runtime.fallback.counters``), with the reasons it fell back.
"""
from __future__ import annotations

import argparse
import copy
import time

import torch

import torch_autows  # noqa: F401  (registers backend="autows" where the package is not pip-installed)


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default=None,
                   help="default: bf16 on CUDA, fp32 on CPU")
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--seq", type=int, default=None)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--iters", type=int, default=None, help="timed steps (default: 20 on CUDA, 3 on CPU)")
    p.add_argument("--train", action="store_true", help="time forward + backward")
    p.add_argument("--mode", default=None, help="torch.compile mode for both compiled variants")
    p.add_argument("--dynamic", action="store_true", help="mark the sequence length dynamic")
    return p


def finish(args: argparse.Namespace, cuda_defaults: dict, cpu_defaults: dict) -> argparse.Namespace:
    """Fill size defaults by device (small on CPU, where autows falls back and says so)."""
    defaults = cuda_defaults if args.device.startswith("cuda") else cpu_defaults
    for k, v in defaults.items():
        if getattr(args, k, None) is None:
            setattr(args, k, v)
    if args.dtype is None:
        args.dtype = "bf16" if args.device.startswith("cuda") else "fp32"
    if args.iters is None:
        args.iters = 20 if args.device.startswith("cuda") else 3
    return args


DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def hidden_states(args: argparse.Namespace):
    """``make_inputs`` for a stack of blocks: one [batch, seq, dim] activation (with grad when training)."""
    return lambda device, dtype: [torch.randn(args.batch, args.seq, args.dim, device=device, dtype=dtype,
                                              requires_grad=args.train)]


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


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


def _time(fn, inputs, args) -> tuple[float, torch.Tensor]:
    out = None
    for _ in range(2):  # compile + warm-up (CUDA graphs record on a later call)
        out = _step(fn, inputs, args.train)
    _sync(args.device)
    t0 = time.perf_counter()
    for _ in range(args.iters):
        out = _step(fn, inputs, args.train)
    _sync(args.device)
    return (time.perf_counter() - t0) * 1e3 / args.iters, _logits(out)


def run(name: str, make_model, make_inputs, args: argparse.Namespace) -> None:
    """Compare eager, Inductor and autows on ``make_model()`` (fp32, on CPU) and ``make_inputs(device, dtype)``."""
    from torch_autows.inductor import target
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
    rows = []
    for label, fn in (("eager", model),
                      ("inductor", torch.compile(model, mode=args.mode)),
                      ("autows", torch.compile(model, backend="autows", mode=args.mode))):
        if label == "autows":
            target.reset()
            fallback.reset()
        ms, out = _time(fn, inputs, args)
        diff = out.float() - ref
        rows.append((label, ms, diff.abs().max().item(), (diff.norm() / ref.norm()).item()))
        if label == "autows":
            sites = dict(target.site_counters)
            fallback.reset()
            _step(fn, inputs, args.train)  # count one step's calls
            calls = dict(fallback.counters)
            why = sorted({r for _, r in fallback._logged} | {r for _, r in target._logged})
    print(f"{'variant':<10}{'ms/step':>12}{'max |err| vs fp32 eager':>28}{'rel err (norm)':>16}")
    for label, ms, err, rel in rows:
        print(f"{label:<10}{ms:>12.3f}{err:>28.3e}{rel:>16.3e}")
    print(f"{'speedup autows vs inductor':<30}{rows[1][1] / rows[2][1]:>8.2f}x")
    for op, kinds in (("attention", ("attention",)), ("gemm", ("gemm", "bmm"))):
        served = sum(calls.get(f"{k}.autows", 0) for k in kinds)
        fell = sum(calls.get(f"{k}.fallback", 0) for k in kinds)
        print(f"autows {op:<9}: {sites.get(f'{op}.rewritten', 0)} site(s) rewritten, "
              f"{sites.get(f'{op}.left', 0)} left to Inductor; one step: {served} call(s) served by generated "
              f"kernels, {fell} fell back to torch")
    if args.mode in ("reduce-overhead", "max-autotune"):  # the modes that use CUDA graphs
        print("  (CUDA-graph replays run no Python, so calls are counted only where a step is not replayed)")
    if sites.get("gemm.choice"):
        print(f"autows gemm      : offered as an autotuning choice at {sites['gemm.choice']} site(s)")
    for r in why:
        print(f"  why not autows: {r}")
