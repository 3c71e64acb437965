"""A Llama-style decoder under tensor parallelism (inference) and FSDP2 (training), each block compiled with
``backend="autows"``; checked against a single-process eager reference (fp32 by default) and, on GPU, timed
against Inductor.

    torchrun --nproc-per-node 2 examples/distributed_llama.py                 # both modes, CUDA if present
    torchrun --nproc-per-node 2 examples/distributed_llama.py --mode tp --device cpu --dim 64 --heads 4

``--mode tp``: ``parallelize_module`` per block (colwise wq/wk/wv and gate/up w1/w3, rowwise wo and down w2;
each rank keeps its share of the heads), one replicated prefill batch, output vs the unsharded eager model.
``--mode fsdp``: ``fully_shard`` per block and on the root, each rank a different slice of the batch,
``--steps`` SGD steps; the loss (averaged over ranks) and every full gradient vs the eager model on the
whole batch. On GPU (NCCL) both runs are also timed for ``backend="inductor"`` with
``torch.utils.benchmark`` (the same number of steps on every rank: a collective must not wait for a rank
that stopped), each with its distance to the reference, and ``--record bench/results`` writes them as a bench
result. On CPU (gloo) autows falls back to torch, says why (its kernels need sm_90 GPUs) and nothing is
timed. The functions here are also what test/distributed/ runs on two CPU processes.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import sys

import torch
import torch.distributed as dist
from torch import nn

import torch_autows  # noqa: F401  (registers backend="autows" where the package is not pip-installed)
from torch_autows.bench.llama import LlamaConfig, build_model, forward_flops

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
#: Relative error (norm of the difference / norm of the reference) a run may have against the eager reference.
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float16: 1e-2}


def init(device: str) -> tuple[int, int, torch.device]:
    """Join the process group torchrun describes (NCCL on CUDA, gloo on CPU): (rank, world size, device)."""
    if "RANK" not in os.environ:
        sys.exit("error: run under torchrun, e.g. torchrun --nproc-per-node 2 examples/distributed_llama.py "
                 "--device cpu (RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT are not set)")
    if device == "cuda" and not torch.cuda.is_available():
        sys.exit("error: --device cuda but this torch sees no CUDA GPU; run with --device cpu (gloo; autows then "
                 "falls back to torch and says why)")
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device == "cuda" else "gloo", timeout=datetime.timedelta(seconds=120))
    dev = torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else torch.device("cpu")
    return dist.get_rank(), dist.get_world_size(), dev


def make_config(args: argparse.Namespace) -> LlamaConfig:
    return LlamaConfig(hidden=args.dim, n_heads=args.heads, n_kv_heads=args.kv_heads, head_dim=args.dim // args.heads,
                       ffn=args.ffn, n_layers=args.layers, max_seq_len=args.seq)


def compile_blocks(model: nn.Module, backend: str | None) -> nn.Module:
    """``block.compile(backend=...)`` for every decoder block (in place: FSDP's hooks stay on the module);
    ``backend`` None leaves the model eager."""
    if backend is not None:
        for block in model.layers:
            block.compile(backend=backend)
    return model


# --- tensor parallelism (inference) ---

TP_PLAN = {"attn.wq": "colwise", "attn.wk": "colwise", "attn.wv": "colwise", "attn.wo": "rowwise",
           "mlp.w1": "colwise", "mlp.w3": "colwise", "mlp.w2": "rowwise"}


def tensor_parallel(model: nn.Module, mesh) -> nn.Module:
    """``parallelize_module`` every block with ``TP_PLAN``; each attention keeps ``1/tp`` of the heads."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    tp = mesh.size()
    cfg = model.cfg
    if cfg.n_heads % tp or cfg.n_kv_heads % tp or cfg.ffn % tp:
        raise ValueError(f"heads {cfg.n_heads}, kv heads {cfg.n_kv_heads} and ffn {cfg.ffn} must be divisible by "
                         f"the {tp} ranks; pick --heads/--kv-heads/--ffn accordingly")
    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    for block in model.layers:
        parallelize_module(block, mesh, {name: styles[s]() for name, s in TP_PLAN.items()})
        block.attn.cfg = dataclasses.replace(cfg, n_heads=cfg.n_heads // tp, n_kv_heads=cfg.n_kv_heads // tp)
    return model


def run_tp(args, device: torch.device, dtype: torch.dtype, backend: str | None, *, seed: int = 0):
    """(the TP model's output, the unsharded eager output, the compiled TP model) on the same prefill batch."""
    from torch.distributed.device_mesh import init_device_mesh

    cfg = make_config(args)
    ref_model = build_model(cfg, device=device, dtype=args.ref_dtype, seed=seed)
    model = compile_blocks(tensor_parallel(build_model(cfg, device=device, dtype=dtype, seed=seed),
                                           init_device_mesh(device.type, (dist.get_world_size(),))), backend)
    x = torch.randn(args.batch, args.seq, cfg.hidden, generator=torch.Generator().manual_seed(seed + 1)).to(device,
                                                                                                          dtype)
    with torch.no_grad():
        return model(x), ref_model(x.to(args.ref_dtype)), model, x


# --- FSDP2 (training) ---

def shard_fsdp(model: nn.Module, mesh) -> nn.Module:
    """``fully_shard`` on every block, then on the root (the final norm and the RoPE tables)."""
    from torch.distributed.fsdp import fully_shard

    for block in model.layers:
        fully_shard(block, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def _loss(out: torch.Tensor) -> torch.Tensor:
    return out.float().square().mean()


def run_fsdp(args, device: torch.device, dtype: torch.dtype, backend: str | None, *, seed: int = 0,
             lr: float = 0.1):
    """``args.steps`` SGD steps of the FSDP2 model (this rank's slice of the batch) and of the eager model on
    the whole batch. Returns per step (loss averaged over ranks, reference loss, {name: (full grad, ref grad)}),
    and the sharded model."""
    from torch.distributed.device_mesh import init_device_mesh

    world, rank = dist.get_world_size(), dist.get_rank()
    if args.batch % world:
        raise ValueError(f"--batch {args.batch} must be divisible by the {world} ranks (each takes a slice)")
    cfg = make_config(args)
    ref_model = build_model(cfg, device=device, dtype=args.ref_dtype, seed=seed).train()
    model = compile_blocks(shard_fsdp(build_model(cfg, device=device, dtype=dtype, seed=seed).train(),
                                      init_device_mesh(device.type, (world,))), backend)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    ref_opt = torch.optim.SGD(ref_model.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed + 1)
    steps = []
    for _ in range(args.steps):
        x = torch.randn(args.batch, args.seq, cfg.hidden, generator=gen).to(device, dtype)
        mine = x.chunk(world)[rank]
        loss = _loss(model(mine))
        loss.backward()
        ref_loss = _loss(ref_model(x.to(args.ref_dtype)))
        ref_loss.backward()
        avg = loss.detach().clone()
        dist.all_reduce(avg, op=dist.ReduceOp.SUM)
        ref_grads = dict(ref_model.named_parameters())
        grads = {name: (p.grad.full_tensor(), ref_grads[name].grad.clone()) for name, p in model.named_parameters()}
        steps.append((avg.item() / world, ref_loss.item(), grads))
        for o in (opt, ref_opt):
            o.step()
            o.zero_grad(set_to_none=True)
    return steps, model


# --- reporting ---

def rel_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    """``|a - ref| / |ref|`` (Frobenius norms, fp32); inf for a shape mismatch."""
    if a.shape != ref.shape:
        return float("inf")
    a, ref = a.detach().float(), ref.detach().float()
    return ((a - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def check_tp(out, ref, dtype) -> tuple[bool, str]:
    e = rel_err(out, ref)
    return e <= TOLERANCE[dtype], f"tp   output vs unsharded eager: rel err {e:.2e} (tolerance {TOLERANCE[dtype]:.0e})"


def check_fsdp(steps, dtype) -> tuple[bool, str]:
    tol, ok, lines = TOLERANCE[dtype], True, []
    for i, (loss, ref_loss, grads) in enumerate(steps):
        le = abs(loss - ref_loss) / max(abs(ref_loss), 1e-30)
        name, ge = max(((n, rel_err(g, r)) for n, (g, r) in grads.items()), key=lambda t: t[1])
        ok &= le <= tol and ge <= tol
        lines.append(f"fsdp step {i}: loss {loss:.6f} vs eager {ref_loss:.6f} (rel err {le:.2e}); worst grad "
                     f"{name}: rel err {ge:.2e} (tolerance {tol:.0e})")
    return ok, "\n".join(lines)


def _time(fn, steps: int, reps: int) -> list[float]:
    """Seconds per call, ``reps`` times over ``steps`` calls: fixed counts, so every rank runs the same collectives."""
    from torch.utils.benchmark import Timer

    dist.barrier()
    timer = Timer(stmt="fn()", globals={"fn": fn})
    return [timer.timeit(steps).median for _ in range(reps)]


def worst_grad(steps) -> float:
    """The largest relative error of any full gradient at any step (``run_fsdp``'s steps)."""
    return max(rel_err(g, r) for _, _, grads in steps for g, r in grads.values())


def time_against_inductor(args, device, dtype) -> tuple[list[str], list[dict]]:
    """Median ms per TP prefill and per FSDP step (forward, backward, SGD) for inductor and autows, each with
    its distance to the reference (``--ref-dtype``): printed lines, and result rows for ``--record``."""
    from torch_autows.bench.results import make_row
    from torch_autows.inductor import support as target

    lines, rows, med = [], [], lambda ts: sorted(ts)[len(ts) // 2] * 1e3
    world = dist.get_world_size()
    for mode in args.modes:
        ms, err = {}, {}
        for backend in ("inductor", "autows"):
            target.reset()
            if mode == "tp":
                out, ref, model, x = run_tp(args, device, dtype, backend)
                err[backend] = rel_err(out, ref)

                def fn(model=model, x=x):
                    with torch.no_grad():
                        model(x)
            else:
                steps, model = run_fsdp(args, device, dtype, backend)
                err[backend] = worst_grad(steps)
                opt = torch.optim.SGD(model.parameters(), lr=1e-6)
                x = torch.randn(args.batch // world, args.seq, args.dim, device=device, dtype=dtype)

                def fn(model=model, x=x, opt=opt):
                    _loss(model(x)).backward()
                    opt.step()
                    opt.zero_grad(set_to_none=True)
            for _ in range(3):  # warm-up: compile, autotune, CUDA graphs
                fn()
            torch.cuda.synchronize()
            samples = _time(lambda fn=fn: (fn(), torch.cuda.synchronize()), args.timed_steps, args.reps)
            ms[backend] = med(samples)
            case = (f"{mode} {world}x{args.batch}x{args.seq} d{args.dim} L{args.layers} "
                    + ("prefill" if mode == "tp" else "train step"))
            spread = (max(samples) - min(samples)) / max(med(samples) / 1e3, 1e-30)
            # the whole job's FLOPs (every rank's share), per step: forward, or forward + backward (3x)
            flops = forward_flops(make_config(args), args.batch, args.seq) * (1 if mode == "tp" else 3)
            rows.append(make_row("distributed", case, backend, tflops=flops / ms[backend] * 1e-9, ms=ms[backend],
                                 rel_err=err[backend], spread=spread,
                                 samples_ms=[t * 1e3 for t in samples], ranks=world,
                                 sites=dict(sorted(target.site_counters.items())) if backend == "autows" else None))
        what = "prefill" if mode == "tp" else "train step"
        lines.append(f"{mode:<4} ms/{what}: inductor {ms['inductor']:.3f}, autows {ms['autows']:.3f}, speedup autows "
                     f"vs inductor {ms['inductor'] / ms['autows']:.2f}x (median of {args.reps} x {args.timed_steps}); "
                     f"rel err vs {args.ref_dtype} eager: inductor {err['inductor']:.2e}, autows {err['autows']:.2e}")
    return lines, rows


def record(out_dir: str, rows: list[dict], argv: list[str] | None) -> str:
    """Write the rows as ``<out>/<date>-<gpu>-distributed.json`` (bench/results' format; ``python -m
    torch_autows.bench report`` then puts them in BENCHMARKS.md)."""
    from pathlib import Path

    from torch_autows.bench.results import collect_meta, result_path, write_json

    argv, world = (sys.argv[1:] if argv is None else argv), dist.get_world_size()
    meta = collect_meta("distributed", argv, world_size=world)
    meta["command"] = "torchrun --nproc-per-node %d examples/distributed_llama.py %s" % (world, " ".join(argv))
    return str(write_json(result_path(Path(out_dir), meta["date"], meta["gpu"], "distributed"), meta, rows))


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=["tp", "fsdp", "both"], default="both")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=list(DTYPES), default=None, help="default: bf16 on CUDA, fp32 on CPU")
    p.add_argument("--ref-dtype", choices=list(DTYPES), default="fp32",
                   help="the single-process eager reference's dtype (default fp32)")
    p.add_argument("--backend", default="autows", help="the backend checked (default autows)")
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--seq", type=int, default=None)
    p.add_argument("--dim", type=int, default=None)
    p.add_argument("--heads", type=int, default=None)
    p.add_argument("--kv-heads", type=int, default=None)
    p.add_argument("--ffn", type=int, default=None)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--steps", type=int, default=2, help="FSDP training steps checked (default 2)")
    p.add_argument("--timed-steps", type=int, default=10, help="GPU: calls per timing (default 10)")
    p.add_argument("--reps", type=int, default=5, help="GPU: timings per backend; the median is printed (default 5)")
    p.add_argument("--record", metavar="DIR", default=None,
                   help="GPU: also write the timings as a bench result under DIR (e.g. bench/results)")
    args = p.parse_args(argv)
    gpu = args.device == "cuda"
    defaults = (dict(batch=4, seq=2048, dim=4096, heads=32, kv_heads=8, ffn=14336) if gpu
                else dict(batch=2, seq=32, dim=128, heads=4, kv_heads=2, ffn=256))
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    args.dtype = DTYPES[args.dtype or ("bf16" if gpu else "fp32")]
    args.ref_dtype = DTYPES[args.ref_dtype]
    args.modes = ["tp", "fsdp"] if args.mode == "both" else [args.mode]
    return args


def main(argv=None) -> int:
    from torch_autows.inductor import support as target
    from torch_autows.runtime import fallback

    args = parse(argv)
    rank, world, device = init(args.device)
    say = print if rank == 0 else (lambda *a, **k: None)
    say(f"distributed_llama: {world} ranks, device={args.device}, dtype={args.dtype}, backend={args.backend}, "
        f"dim {args.dim}, heads {args.heads}/{args.kv_heads}, ffn {args.ffn}, layers {args.layers}, "
        f"batch {args.batch} x seq {args.seq}; torch {torch.__version__}")
    gpu = args.device == "cuda" and torch.cuda.get_device_capability() == (9, 0)
    if not gpu:
        say(f"note: on {args.device} the generated kernels cannot run (they need sm_90 GPUs): autows falls back to "
            "torch, only correctness is checked, nothing is timed")
    ok = True
    for mode in args.modes:
        target.reset()
        fallback.reset()
        if mode == "tp":
            out, ref, _, _ = run_tp(args, device, args.dtype, args.backend)
            good, line = check_tp(out, ref, args.dtype)
        else:
            steps, _ = run_fsdp(args, device, args.dtype, args.backend)
            good, line = check_fsdp(steps, args.dtype)
        flags = torch.tensor([int(good)], device=device)
        dist.all_reduce(flags, op=dist.ReduceOp.MIN)  # every rank checks its own copy; all must agree
        ok &= bool(flags.item())
        say(line)
        say(f"{mode:<4} {'ok' if flags.item() else 'MISMATCH'} on every rank; compiled sites "
            f"{dict(sorted(target.site_counters.items()))}, calls {dict(sorted(fallback.counters.items()))}")
    if gpu and ok:
        lines, rows = time_against_inductor(args, device, args.dtype)
        for line in lines:
            say(line)
        if args.record and rank == 0:
            say(f"recorded {record(args.record, rows, argv)}")
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
