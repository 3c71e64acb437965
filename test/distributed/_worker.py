"""One rank of test_distributed_cpu.py: the example's TP and FSDP2 runs on gloo, with the FX rewrites forced on.

    python test/distributed/_worker.py OUT_DIR MODE[,MODE] PRETEND   # RANK, WORLD_SIZE, MASTER_ADDR/PORT set

``PRETEND`` 1 does what test/inductor/conftest.py's ``pretend`` fixture does: CPU graphs count as sm_90
targets and the runtime's support checks say yes, so the attention and GEMM rewrites fire on the DTensor /
FSDP graphs; the ops then see CPU tensors at run time and fall back to torch. Each rank writes
``OUT_DIR/rank<r>.json``: per mode the relative errors against the eager reference, the compile-time site
counts and the run-time call counts; a failure writes its traceback there instead.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "examples")]


def _pretend() -> None:
    """As test/inductor/conftest.py's ``pretend``: the compile-time support checks say yes; the run-time ones
    (device checked) stay real, so the ops fall back to torch on CPU."""
    from torch_autows.inductor import support
    from torch_autows.runtime import attention as rt_attention
    from torch_autows.runtime import gemm as rt_gemm

    support._pretend_target = True
    for rt in (rt_attention, rt_gemm):
        real = rt.support_reason

        def support_reason(*args, check_device: bool = True, _real=real, **kwargs):
            return None if not check_device else _real(*args, check_device=check_device, **kwargs)

        rt.support_reason = support_reason


def _dtensor_attention() -> dict:
    """Attention whose q, k, v are DTensors (heads sharded over the ranks) in the Dynamo graph: what a TP plan
    with ``use_local_output=False`` on the projections hands the rewrite. Explicit form: gloo's CPU DTensor
    has no sharding strategy for SDPA's CPU kernel (CUDA's flash/efficient ones have)."""
    import torch
    import torch.distributed as dist
    from distributed_llama import rel_err
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    g = torch.Generator().manual_seed(3)
    full = [torch.randn(2, 4, 16, 16, generator=g) for _ in range(3)]
    q, k, v = (distribute_tensor(t, mesh, [Shard(1)]) for t in full)

    def attn(q, k, v):
        return (q @ k.transpose(-2, -1) * 0.25).softmax(-1) @ v

    out = torch.compile(attn, backend="autows")(q, k, v)
    return {"output": rel_err(out.full_tensor(), attn(*full))}


def _no_graph_caches() -> None:
    """Every compile runs the passes (and so counts its sites): no FX-graph or AOTAutograd cache hits, whatever
    the other rank or an earlier run left. Compiled C++ kernels are still shared through the cache dir."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    inductor_config.fx_graph_cache = False
    inductor_config.fx_graph_remote_cache = False
    functorch_config.enable_autograd_cache = False


def _one(mode: str, args) -> dict:
    import distributed_llama as ex
    import torch

    from torch_autows.inductor import support as target
    from torch_autows.runtime import fallback

    target.reset()
    fallback.reset()
    if mode == "dtensor_attention":
        errs = _dtensor_attention()
    elif mode == "tp":
        out, ref, _, _ = ex.run_tp(args, torch.device("cpu"), torch.float32, "autows")
        errs = {"output": ex.rel_err(out, ref)}
    else:
        steps, _ = ex.run_fsdp(args, torch.device("cpu"), torch.float32, "autows")
        errs = {}
        for i, (loss, ref_loss, grads) in enumerate(steps):
            errs[f"step{i}.loss"] = abs(loss - ref_loss) / abs(ref_loss)
            errs.update({f"step{i}.grad.{n}": ex.rel_err(g, r) for n, (g, r) in grads.items()})
    return {"errors": errs, "sites": dict(target.site_counters), "calls": dict(fallback.counters),
            "reasons": sorted({r for _, r in fallback._logged} | {r for _, r in target._logged})}


def main() -> None:
    out_dir, modes, pretend = Path(sys.argv[1]), sys.argv[2].split(","), sys.argv[3] == "1"
    rank = int(os.environ["RANK"])
    result: dict = {}
    try:
        import distributed_llama as ex

        if pretend:
            _pretend()
        _no_graph_caches()
        args = ex.parse(["--device", "cpu", "--batch", "2", "--seq", "16", "--dim", "64", "--heads", "4",
                         "--kv-heads", "2", "--ffn", "128", "--layers", "1", "--steps", "2"])
        ex.init("cpu")
        for mode in modes:
            t0 = time.perf_counter()
            result[mode] = _one(mode, args)
            result[mode]["seconds"] = round(time.perf_counter() - t0, 1)
    except BaseException:
        result["traceback"] = traceback.format_exc()
    (out_dir / f"rank{rank}.json").write_text(json.dumps(result, indent=1))
    import torch.distributed as dist

    if dist.is_initialized() and "traceback" not in result:
        dist.destroy_process_group()
    sys.exit(1 if "traceback" in result else 0)


if __name__ == "__main__":
    main()
