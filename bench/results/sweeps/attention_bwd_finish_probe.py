"""Where the fused convert's time goes: the fused main kernel with emitter variants (full / arrival only / no
completion wait / 64-element chunks) against the unfused kernel, per-kernel times by the profiler."""
import json, os, sys, time
sys.path.insert(0, os.getcwd())
OUT = os.environ.get("OUT", ".")
import torch
from torch_autows.codegen import sm90
from torch_autows.runtime import attention_bwd as rt
from torch_autows.runtime import launch
sys.path.insert(0, "bench/results/sweeps")
from attention_bwd_finish import inputs, kernel_us, fn

orig = sm90.EMITTERS["finish_reduce"]


def arrive_only(ctx, o, indent):
    lines = orig(ctx, o, indent)
    i = next(k for k, l in enumerate(lines) if l.startswith("if fin_seen"))
    return lines[:i + 1] + [lines[-1]]


def nowait(ctx, o, indent):
    return [l for l in orig(ctx, o, indent) if not l.startswith("bulk_wait_complete")]


VARIANTS = {"full": (orig, 32), "arrive": (arrive_only, 32), "nowait": (nowait, 32), "chunk64": (orig, 64),
            "chunk16": (orig, 16)}


def reset():
    launch.compile_kernel.cache_clear()
    rt._BOUND.clear() if hasattr(rt._BOUND, "clear") else None
    rt._PLANS.clear() if hasattr(rt._PLANS, "clear") else None
    rt._stages_in_slots.cache_clear()


CASES = [(4096, 64, False), (1024, 128, True), (4096, 128, False), (1024, 64, False)]


def set_variant(name):
    em, ch = VARIANTS[name]
    sm90.EMITTERS["finish_reduce"] = em
    sm90.FINISH_CHUNK = ch
    reset()


def warm(job):
    (s, d, causal), name = job
    try:
        args = inputs(s, d, causal, small=True)
        if name == "convert":
            fn({"dq_mode": "reduce", "finish": False}, args, causal)()
        else:
            set_variant(name)
            fn({"dq_mode": "reduce", "finish": True}, args, causal)()
        torch.cuda.synchronize()
        return "ok"
    except Exception as e:
        return f"{type(e).__name__}: {str(e)[:200]}"


if __name__ == "__main__":
    import multiprocessing as mp
    t0 = time.time()
    with mp.get_context("spawn").Pool(12) as pool:
        print(pool.map(warm, [(c, n) for c in CASES for n in ("convert", *VARIANTS)]), time.time() - t0, flush=True)
res = {"device": torch.cuda.get_device_name(), "rows": []}
for s, d, causal in (CASES if __name__ == "__main__" else ()):
    args = inputs(s, d, causal)
    r = {"case": f"s{s}-d{d}{'-causal' * causal}"}
    reset()
    r["convert"] = kernel_us(fn({"dq_mode": "reduce", "finish": False}, args, causal))
    for name in VARIANTS:
        set_variant(name)
        try:
            r[name] = kernel_us(fn({"dq_mode": "reduce", "finish": True}, args, causal))
        except Exception as e:
            r[name] = f"{type(e).__name__}: {str(e)[:200]}"
    sm90.EMITTERS["finish_reduce"] = orig
    sm90.FINISH_CHUNK = 32
    print(json.dumps(r), flush=True)
    res["rows"].append(r)
    with open(os.path.join(OUT, "finish_probe.json"), "w") as f:
        json.dump(res, f, indent=1)
