"""GPU probe (not a test), session 27: (A) the attention backward's row kernels at 16k tokens x 2048 wide: the dQ
workspace zeroed in the delta kernel (``attention_bwd_rows.preprocess(workspace=...)``) against delta + a separate
fill (``torch.zeros``, as before), and block / warp-count variants of both row kernels; (B) the whole backward at
s512-s4096, d64/d128, causal or not, against cuDNN's: the pick with the old rows (delta, then the fill) and the new,
and at up to 2048 keys the reduce and separate forms forced; (C) the d=256 causal forward, ``ws_p_128x64_rm_g16_dm_s3``
against its store_in_ring form and cuDNN. Median of 5 interleaved do_bench rounds; every kernel compiled first in 12
parallel processes. Writes $OUT/probe1.json.

    python bench/results/sweeps/attention_bwd_rows_probe.py
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import statistics
import sys
import time
import traceback

OUT = os.environ.get("OUT", ".")
ROUNDS = 5
BWD_SEQS = (512, 1024, 2048, 4096)
FWD = [(512, True), (1024, True), (2048, True), (1024, False)]
FWD_CONFIGS = ("ws_p_128x64_rm_g16_dm_s3", "ws_p_128x64_rm_g16_dm_s3_sr")


def bwd_variants(s, d, causal):
    v = {"pick_old": {}, "pick_new": {}}
    if s <= 2048:
        v["reduce"] = {"dq_mode": "reduce"}
        v["separate"] = {"dq_mode": "separate"}
    return v


def make_bwd(s, d, causal, small=False):
    import torch

    from torch_autows.sdpa_fallback import fused_attention
    B, H = (1, 2) if small else (16384 // s, 2048 // d)
    scale = d ** -0.5
    q, k, v, go = (torch.randn(B, H, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    out, lse = fused_attention("cudnn", q, k, v, causal, scale)
    return q, k, v, go, out, lse, scale


OLD = {"on": False}


def install_old_rows():
    from torch_autows.runtime import attention_bwd_rows as rows
    orig = rows.preprocess

    def patched(out, go, lse, glse=None, kernel=None, workspace=None):
        if OLD["on"] and workspace is not None:
            r = orig(out, go, lse, glse, kernel=kernel)
            workspace.zero_()
            return r
        return orig(out, go, lse, glse, kernel=kernel, workspace=workspace)
    rows.preprocess = patched


def bwd_fn(name, kw, args, causal):
    from torch_autows.runtime import attention_bwd as rt
    q, k, v, go, out, lse, scale = args

    def f():
        OLD["on"] = name == "pick_old"
        return rt.backward(go, None, q, k, v, out, lse, causal, scale, **kw)
    return f


def fwd_fn(config, q, k, v, causal, scale):
    from torch_autows.runtime import attention as fa
    return lambda: fa.attention(q, k, v, causal, scale, config=config)


def warm_job(job):
    try:
        import torch
        install_old_rows()
        if job[0] == "bwd":
            _, s, d, causal = job
            args = make_bwd(s, d, causal, small=True)
            for name, kw in bwd_variants(s, d, causal).items():
                bwd_fn(name, kw, args, causal)()
        else:
            _, s, causal, config = job
            q, k, v = (torch.randn(1, 2, s, 256, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            fwd_fn(config, q, k, v, causal, 256 ** -0.5)()
        torch.cuda.synchronize()
        return job, "ok"
    except Exception as e:
        return job, f"{type(e).__name__}: {str(e)[:300]}"


def interleaved(fns, rep=60):
    from triton.testing import do_bench
    t = {n: [] for n in fns}
    for _ in range(ROUNDS):
        for n, f in fns.items():
            t[n].append(do_bench(f, warmup=10, rep=rep))
    return {n: statistics.median(x) for n, x in t.items()}, {n: (max(x) - min(x)) / statistics.median(x)
                                                              for n, x in t.items()}


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def part_rows():
    return [_rows_case(d) for d in (64, 128)]


def _rows_case(d):
    import torch
    import triton

    from torch_autows.runtime import attention_bwd_rows as rows
    from torch_autows.templates import attention_bwd as tmpl
    S, B, H = 1024, 16, 2048 // d
    o, do = (torch.randn(B, H, S, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    lse = torch.randn(B, H, S, device="cuda")
    ws = torch.full((B * H * S, d), float("nan"), device="cuda")
    got = rows.preprocess(o, do, lse, None, workspace=ws)
    want = tmpl.preprocess(o, do, lse, None)
    ok = (rel(got[0], want[0]) < 1e-5 and torch.equal(got[1], want[1]) and torch.count_nonzero(ws).item() == 0)
    n = B * H * S
    lsef = lse.reshape(n).contiguous()
    delta, lse2 = tmpl.row_vectors(B, H, S, o.device)

    def direct(block, nw, zero=True):
        scal = (n, H, S, S, delta.stride(0), *o.stride()[:3], *do.stride()[:3], d, d, block, False, zero,
                tmpl.LOG2E)
        ten = (o, do, lsef, lsef, delta, lse2, ws if zero else delta)
        k = rows._delta_kernel()
        return lambda: k[(triton.cdiv(n, block),)](*ten, *scal, num_warps=nw)
    acc = torch.randn(B * H * S, d, device="cuda")
    dq = torch.empty(B, H, S, d, device="cuda", dtype=torch.bfloat16)

    def conv(block, nw):
        k = rows._dq_kernel()
        return lambda: k[(triton.cdiv(n, block),)](acc, dq, 0.1, n, S, S, d, d, block, num_warps=nw)
    fns = {"old_delta_plus_zeros": lambda: (rows.preprocess(o, do, lse, None),
                                            torch.zeros(B * H * S, d, device="cuda")),
           "new_delta_zeroing": lambda: rows.preprocess(o, do, lse, None, workspace=ws),
           "delta_only": lambda: rows.preprocess(o, do, lse, None),
           "zeros_only": lambda: torch.zeros(B * H * S, d, device="cuda"),
           "convert": lambda: rows.postprocess(acc, 0.1, dq)}
    for blk in (32, 64, 128, 256):
        for nw in (4, 8):
            fns[f"zeroing_b{blk}_w{nw}"] = direct(blk, nw)
            fns[f"convert_b{blk}_w{nw}"] = conv(blk, nw)
    for f in fns.values():
        f()
    torch.cuda.synchronize()
    ms, spread = interleaved(fns, rep=40)
    r = {"d": d, "ok": ok, "us": {k_: round(v * 1e3, 2) for k_, v in ms.items()},
         "spread": {k_: round(v, 3) for k_, v in spread.items()}}
    print("rows", json.dumps(r), flush=True)
    return r


def part_bwd():
    return [_bwd_case(s, d, causal) for d in (64, 128) for causal in (False, True) for s in BWD_SEQS]


def _bwd_case(s, d, causal):
    import torch

    from torch_autows.attention_grad import _cudnn_backward
    from torch_autows.runtime import attention_bwd as rt
    torch.cuda.empty_cache()  # the previous case's tensors
    args = make_bwd(s, d, causal)
    q, k, v, go, out, lse, scale = args
    fns = {"cudnn": lambda: _cudnn_backward(go, q, k, v, out, lse, causal, scale)}
    for name, kw in bwd_variants(s, d, causal).items():
        fns[name] = bwd_fn(name, kw, args, causal)
    ref = fns["cudnn"]()
    err = {}
    for n, f in list(fns.items()):
        try:
            err[n] = max(rel(x, y) for x, y in zip(f(), ref))
        except Exception as e:
            err[n] = f"{type(e).__name__}: {str(e)[:200]}"
            del fns[n]
    torch.cuda.synchronize()
    ms, spread = interleaved(fns)
    B, H = 16384 // s, 2048 // d
    flops = 2.5 * 4 * B * H * s * s * d / (2 if causal else 1)
    mode = rt.choose_dq_mode(None, d, s, causal)
    r = {"case": f"s{s}-d{d}{'-causal' * causal}", "pick": [mode, rt.choose_config(d, causal, mode, s)],
         "tflops": {n: round(flops / t / 1e9, 1) for n, t in ms.items()},
         "spread": {n: round(x, 3) for n, x in spread.items()}, "err": err}
    r["vs_cudnn"] = {n: round(r["tflops"][n] / r["tflops"]["cudnn"], 3) for n in ms}
    print("bwd", json.dumps(r), flush=True)
    return r


def part_fwd():
    return [_fwd_case(s, causal) for s, causal in FWD]


def _fwd_case(s, causal):
    import torch

    from torch_autows.sdpa_fallback import fused_attention
    B, H, d = 16384 // s, 16, 256
    scale = d ** -0.5
    q, k, v = (torch.randn(B, H, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    fns = {"cudnn": lambda: fused_attention("cudnn", q, k, v, causal, scale)}
    for c in FWD_CONFIGS:
        fns[c] = fwd_fn(c, q, k, v, causal, scale)
    ref = fns["cudnn"]()[0]
    err = {n: rel(f()[0], ref) for n, f in fns.items()}
    ms, spread = interleaved(fns)
    flops = 4 * B * H * s * s * d / (2 if causal else 1)
    r = {"case": f"s{s}-d256{'-causal' * causal}", "tflops": {n: round(flops / t / 1e9, 1) for n, t in ms.items()},
         "spread": {n: round(x, 3) for n, x in spread.items()}, "err": err}
    print("fwd", json.dumps(r), flush=True)
    return r


def main():
    t0 = time.time()
    jobs = [("bwd", s, d, c) for d in (64, 128) for c in (False, True) for s in BWD_SEQS]
    jobs += [("fwd", s, c, cfg) for s, c in FWD for cfg in FWD_CONFIGS]
    ctx = mp.get_context("spawn")
    with ctx.Pool(12) as pool:
        warm = [(list(j), r) for j, r in pool.imap_unordered(warm_job, jobs)]
    print("warm", round(time.time() - t0, 1), "s", [w for w in warm if w[1] != "ok"], flush=True)
    install_old_rows()
    result = {"warm": warm}
    for name, part in (("rows", part_rows), ("bwd", part_bwd), ("fwd", part_fwd)):
        try:
            result[name] = part()
        except Exception:
            result[name] = traceback.format_exc()
            print(result[name], flush=True)
        print(name, "done", round(time.time() - t0, 1), "s", flush=True)
        import torch
        result["device"] = torch.cuda.get_device_name()
        with open(os.path.join(OUT, "probe1.json"), "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    sys.path.insert(0, os.getcwd())
    main()
