"""Session 28, on commit 9e57cce (the fused dQ convert, reverted since): where the fused form's time goes. The fused
main kernel with its ``finish_reduce`` emitter cut down (full / arrival only / no completion wait / 64- and 16-element
chunks) against the unfused kernel, per-kernel times by the profiler (``attention_bwd_finish.kernel_us``). Writes
$OUT/finish_probe.json."""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import sys
import time

sys.path.insert(0, os.getcwd())
sys.path.insert(0, "bench/results/sweeps")
OUT = os.environ.get("OUT", ".")
CASES = [(4096, 64, False), (1024, 128, True), (4096, 128, False), (1024, 64, False)]
CHUNKS = {"full": 32, "arrive": 32, "nowait": 32, "chunk64": 64, "chunk16": 16}


def emitter(name):
    """The finish_reduce emitter of variant ``name`` (the committed one, or with lines dropped)."""
    from torch_autows.codegen import sm90
    full = sm90.EMITTERS.setdefault("_finish_reduce_full", sm90.EMITTERS["finish_reduce"])

    def arrive_only(ctx, o, indent):  # wait, arrive, reset: no conversion
        lines = full(ctx, o, indent)
        i = next(k for k, line in enumerate(lines) if line.startswith("if fin_seen"))
        return lines[:i + 1] + [lines[-1]]

    def nowait(ctx, o, indent):  # the conversion without waiting for the adds to land (timing only)
        return [line for line in full(ctx, o, indent) if not line.startswith("bulk_wait_complete")]
    return {"arrive": arrive_only, "nowait": nowait}.get(name, full)


def set_variant(name):
    from torch_autows.codegen import sm90
    from torch_autows.runtime import attention_bwd as rt
    from torch_autows.runtime import launch
    sm90.EMITTERS["finish_reduce"] = emitter(name)
    sm90.FINISH_CHUNK = CHUNKS.get(name, 32)
    launch.compile_kernel.cache_clear()
    rt._BOUND.clear()
    rt._PLANS.clear()
    rt._stages_in_slots.cache_clear()


def run(kw, args, causal):
    from attention_bwd_finish import fn
    return fn(kw, args, causal)


def warm(job):
    (s, d, causal), name = job
    try:
        import torch
        from attention_bwd_finish import inputs
        args = inputs(s, d, causal, small=True)
        if name != "convert":
            set_variant(name)
        run({"dq_mode": "reduce", "finish": name != "convert"}, args, causal)()
        torch.cuda.synchronize()
        return "ok"
    except Exception as e:
        return f"{type(e).__name__}: {str(e)[:200]}"


def main():
    import torch
    from attention_bwd_finish import inputs, kernel_us
    t0 = time.time()
    with mp.get_context("spawn").Pool(12) as pool:
        print(pool.map(warm, [(c, n) for c in CASES for n in ("convert", *CHUNKS)]), time.time() - t0, flush=True)
    res = {"device": torch.cuda.get_device_name(), "rows": []}
    for s, d, causal in CASES:
        args = inputs(s, d, causal)
        r = {"case": f"s{s}-d{d}{'-causal' * causal}"}
        set_variant("full")
        r["convert"] = kernel_us(run({"dq_mode": "reduce", "finish": False}, args, causal))
        for name in CHUNKS:
            set_variant(name)
            try:
                r[name] = kernel_us(run({"dq_mode": "reduce", "finish": True}, args, causal))
            except Exception as e:
                r[name] = f"{type(e).__name__}: {str(e)[:200]}"
        set_variant("full")
        print(json.dumps(r), flush=True)
        res["rows"].append(r)
        with open(os.path.join(OUT, "finish_probe.json"), "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
