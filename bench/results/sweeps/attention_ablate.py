"""GPU ablations (not a test; timing only: the patched variants compute wrong numbers on purpose) of the attention
backward's main kernel, and a profile of the forward at short sequences.

Backward: each variant is a base config with ``group_m`` set to a tag (the non-causal walk ignores it: the same
program) and its generated source patched per tag before it compiles: ``novec`` (the lse2/delta pointer loads ->
zeros: their global latency and index math gone), ``nored`` (no TMA reduce-add nor its store_wait), ``nosync`` (no dS
meeting of the two consumers). Whole calls (do_bench, median of 3 interleaved rounds) and per-kernel GPU time
(torch.profiler) at s1024/s4096, d64/d128, no mask, against cuDNN. Forward: the generated kernel and cuDNN at
s512/s1024, d64/d128, causal or not, timed plainly and as CUDA graphs of 10 calls (host overhead out), with their
kernel times.

Run at 8cd7bb1 (``sweeps/2026-12-01-h200-attention-bwd-ablate.json``, ``-attention-short-probe.json``), where the main
kernel read lse2/delta through pointers at the top of every step: ``novec`` took 16-23% off its time. Since, the
producer loads them by TMA (templates/attention_bwd.py) and ``novec`` only matches the dQ kernel's once-a-tile loads; a
variant whose patch no longer matches is reported and skipped.

    python bench/results/sweeps/attention_ablate.py [out.json]
    python bench/results/sweeps/attention_ablate.py --fwd-epilogue [out.json]   # the forward's O / lse stores off
    python bench/results/sweeps/attention_ablate.py --fwd-tile [out.json]       # the forward's tile turn (d=192/256)
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import statistics
import sys
from collections import defaultdict

import torch
from triton.testing import do_bench

import torch_autows.codegen.compile as cc
from torch_autows.attention_grad import _cudnn_backward
from torch_autows.runtime import attention_bwd as rt
from torch_autows.sdpa_fallback import fused_attention

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the sibling sweep script's timing and profile helpers
from attention_bwd_configs import checked_times  # noqa: E402
from attention_bwd_configs import kernel_times as _kernel_times  # noqa: E402

PATCH = {}  # group_m tag -> patches
_gen = cc.generate


def novec(src):
    return re.sub(r"gl\.load\((lse2|delta)_ptr \+ (v_\w+_offs), mask=[^\n]*other=0\.0\)\.to\(gl\.float32\)",
                  r"(\2 * 0).to(gl.float32)", src)


def nored(src):
    src = re.sub(r"\n\s*tma\.store_wait\(0\)[^\n]*", "", src)
    return re.sub(r"\n\s*async_reduce_add_shared_to_global\([^\n]*", "", src)


def nosync(src):
    return re.sub(r"\n\s*mbarrier\.(arrive|wait)\(dss_meet[^\n]*", "", src)


class Unpatched(Exception):
    pass


def generate(program):
    """The program's source with its variant's patches applied; the tag is group_m (backward, --fwd-epilogue) or
    block_k (--fwd-tile), both >= 100, which no config's own value reaches."""
    src = _gen(program)
    o = program.options
    for p in PATCH.get(o.group_m, PATCH.get(o.block_k, ())):
        new = p(src)
        if new == src:
            raise Unpatched(f"{p.__name__} does not match {program.name}'s source")
        src = new
    return src

VARIANTS = []  # (name, mode, base config, patches, d)


def add(name, mode, base, patches, dims):
    tag = 100 + len(VARIANTS)
    rt.CONFIGS[name] = dataclasses.replace(rt.CONFIGS[base], group_m=tag)
    rt.CONFIG_HEAD_DIMS[name] = {"atomic": (), "reduce": (), "separate": (), mode: dims}
    PATCH[tag] = patches
    VARIANTS.append((name, mode, dims))


def add_variants() -> None:
    """Session 13 (the producer's TMA row loads in place): what the 5-GEMM kernel's dQ reduce-adds and its consumers'
    meeting cost now. Session 12's set (``novec`` beside each form) is in git history (b9413d2)."""
    add("sep", "separate", "bwd_64x128_dp2", (), (128,))
    add("split", "reduce", "bwd_64x128_dp2_dqsplit_fold", (), (128,))
    add("split_nored", "reduce", "bwd_64x128_dp2_dqsplit_fold", (nored,), (128,))
    add("split_nosync", "reduce", "bwd_64x128_dp2_dqsplit_fold", (nosync,), (128,))
    add("split_nored_nosync", "reduce", "bwd_64x128_dp2_dqsplit_fold", (nored, nosync), (128,))


def ooff(src):
    """The O stores predicated off by a condition false at run time (qk_scale > 0): no memory traffic, the stores'
    instructions and everything feeding them stay (dropping the store instead lets the compiler remove the P V mma
    and the whole epilogue, as the first run of this script did)."""
    return re.sub(r"(\n\s*gl\.store\(v_out_\w+_p, v_out_\w+, mask=)([^\n]*)\)", r"\1(\2) & (qk_scale < 0.0))", src)


def lseoff(src):
    return re.sub(r"(\n\s*gl\.store\(lse_ptr [^\n]*, mask=)([^\n]*)\)", r"\1(\2) & (qk_scale < 0.0))", src)


#: Forward variants (``--fwd-epilogue``): the short-sequence pick with its O / lse stores predicated off (no mask: the
#: walk ignores group_m, the tag).
FWD = {"fwd": (), "fwd_ooff": (ooff,), "fwd_lseoff": (lseoff,), "fwd_ooff_lseoff": (ooff, lseoff)}


def add_fwd_variants() -> None:
    from torch_autows.runtime import attention as fa
    for name, patches in FWD.items():
        tag = 200 + len(PATCH)
        fa.CONFIGS[name] = dataclasses.replace(fa.CONFIGS["ws_p_128x128_q2_rm_g16"], group_m=tag)
        fa.HEAD_DIMS[name] = (64, 128)
        PATCH[tag] = patches


def fwd_epilogue(s, d):
    """Kernel and call times of the FWD variants (timing only: the dropped stores leave out/lse unwritten)."""
    from torch_autows.runtime import attention as fa
    B, H = 16384 // s, 2048 // d
    q, k, v = (torch.randn(B, H, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    fns = {"cudnn": lambda: fused_attention("cudnn", q, k, v, False, d ** -0.5)}
    fns.update({n: (lambda n=n: fa.attention(q, k, v, False, d ** -0.5, config=n)) for n in FWD})
    ms = interleaved_ms(fns, rep=40)
    kt = {n: kernel_times(f) for n, f in fns.items()}
    print(f"fwd-s{s}-d{d}", {n: round(t * 1e3, 1) for n, t in ms.items()}, kt, flush=True)
    return {"case": f"fwd-s{s}-d{d}", "ms": ms, "kernels_us": kt}


def nostore(src):
    """The O TMA stores and their waits out (the SMEM writes of O into the Q slot stay, so P V and the epilogue do)."""
    src = re.sub(r"\n\s*tma\.async_copy_shared_to_global\(o\w*desc[^\n]*", "", src)
    return re.sub(r"\n\s*tma\.store_wait\(0\)  # TMA has read the slot[^\n]*", "", src)


def earlyq(src):
    """The Q slot released as the K/V loop ends (before the last P V and the epilogue) instead of after O's store
    from it: the producer loads the next tile's Q (and, behind it, K) under this tile's end, as it would with O staged
    elsewhere (the store still reads the slot: racy, timing only)."""
    src = re.sub(r"\n\s*mbarrier\.arrive\(g1_empty\.index\(g1_s\)\)", "", src)
    return re.sub(r"(\n(\s*)v_m_f_(c\d) = v_m_\3\n)", r"\1\2mbarrier.arrive(g1_empty.index(g1_s))\n", src)


#: Tile-turn variants (``--fwd-tile``): (name, base config, patches, head dim); tagged by block_k, which the attention
#: forward does not read (the program is the base config's).
TILE = [("d256", "ws_p_128x64_rm_g16_dm_s3", (), 256), ("d256_nostore", "ws_p_128x64_rm_g16_dm_s3", (nostore,), 256),
        ("d256_earlyq", "ws_p_128x64_rm_g16_dm_s3", (earlyq,), 256),
        ("d256_earlyq_nostore", "ws_p_128x64_rm_g16_dm_s3", (earlyq, nostore), 256),
        # O staged in V's bytes (store_in_ring, correct), and with Q's release moved before the last P V (earlyq:
        # correct there, as O no longer stages in Q's slot)
        ("d256_sr", "ws_p_128x64_rm_g16_dm_s3_sr", (), 256),
        ("d256_sr_earlyq", "ws_p_128x64_rm_g16_dm_s3_sr", (earlyq,), 256),
        ("d192", "ws_p_128x64_rm_g16_sdb_dm_s3_lc_qr", (), 192),
        ("d192_earlyq_nostore", "ws_p_128x64_rm_g16_sdb_dm_s3_lc_qr", (earlyq, nostore), 192),
        ("d192_sr", "ws_p_128x64_rm_g16_sdb_dm_s3_lc_qr_sr", (), 192),
        ("d192_q2", "ws_p_128x64_rm_g16_sdb_dm_s3_lc_q2_qr", (), 192)]  # two Q copies: the pick up to 1024 keys


def add_tile_variants() -> None:
    """``TILE`` into the runtime's tables (``TILE_ONLY=a,b`` in the environment: only those variants)."""
    from torch_autows.runtime import attention as fa
    only = os.environ.get("TILE_ONLY")
    if only:
        TILE[:] = [t for t in TILE if t[0] in only.split(",")]
    for name, base, patches, d in TILE:
        tag = 300 + len(PATCH)
        fa.CONFIGS[name] = dataclasses.replace(fa.CONFIGS[base], block_k=tag)
        fa.HEAD_DIMS[name] = (d,)
        PATCH[tag] = patches


def fwd_tile(s, d, causal):
    """Call and kernel times of the TILE variants of head dim ``d`` against cuDNN (timing only: patched variants
    compute wrong numbers)."""
    from torch_autows.runtime import attention as fa
    B, H = 16384 // s, 2048 // d
    scale = d ** -0.5
    q, k, v = (torch.randn(B, H, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    fns = {"cudnn": lambda: fused_attention("cudnn", q, k, v, causal, scale)}
    fns.update({n: (lambda n=n: fa.attention(q, k, v, causal, scale, config=n)) for n, _, _, dd in TILE if dd == d})
    ms = interleaved_ms(fns, rep=60)
    flops = 4 * B * H * s * s * d / (2 if causal else 1)
    name = f"fwd-s{s}-d{d}{'-causal' * causal}"
    print(name, {n: round(flops / t / 1e9) for n, t in ms.items()}, flush=True)
    return {"case": name, "ms": ms, "tflops": {n: flops / t / 1e9 for n, t in ms.items()}}


def interleaved_ms(fns, rep):
    """Median ms of 3 rounds in which every call of ``fns`` (name -> call) is timed once (do_bench), so clock and
    power drift hit all alike."""
    res = defaultdict(list)
    for _ in range(3):
        for n, f in fns.items():
            res[n].append(do_bench(f, warmup=10, rep=rep))
    return {n: statistics.median(t) for n, t in res.items()}


def kernel_times(fn):
    """``attention_bwd_configs.kernel_times`` (GPU us per kernel name and call), rounded for the printout."""
    return {k: round(v, 1) for k, v in _kernel_times(fn).items()}


def case(s, d):
    B, H = 16384 // s, 2048 // d
    scale = d ** -0.5
    q, k, v, go = (torch.randn(B, H, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    out, lse = fused_attention("cudnn", q, k, v, False, scale)
    fns = {"cudnn": lambda: _cudnn_backward(go, q, k, v, out, lse, False, scale)}
    for name, mode, dims in VARIANTS:
        if d in dims:
            dc = "dq_128x128_dp2_p" if mode == "separate" else None
            fns[name] = (lambda m=mode, c=name, dc=dc:
                         rt.backward(go, None, q, k, v, out, lse, False, scale, config=c, dq_mode=m, dq_config=dc))
    err, ms = checked_times(fns)
    for n in (n for n, e in err.items() if isinstance(e, str)):
        print(n, err[n], flush=True)
    flops = 2.5 * 4 * B * H * s * s * d
    kt = {n: kernel_times(f) for n, f in fns.items()}
    r = {"case": f"s{s}-d{d}", "ms": ms, "tflops": {n: flops / t / 1e9 for n, t in ms.items()}, "err": err,
         "kernels_us": kt}
    print(r["case"], flush=True)
    for n in ms:
        main = {k_: u for k_, u in kt[n].items() if "attn_bwd" in k_ or "kernel" in k_ or "cudnn" in k_.lower()}
        print(f"  {n:28s} {r['tflops'][n]:6.0f} TF  err {err[n] if isinstance(err[n], str) else round(err[n], 4)}"
              f"  {main}", flush=True)
    return r




def graphed(fn):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(10):
            fn()
    return g.replay


def fwd_case(s, d, causal):
    from torch_autows.runtime import attention as fa
    B, H = 16384 // s, 2048 // d
    scale = d ** -0.5
    q, k, v = (torch.randn(B, H, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    fns = {"cudnn": lambda: fused_attention("cudnn", q, k, v, causal, scale),
           "autows": lambda: fa.attention(q, k, v, causal, scale, config="auto")}
    ref = fns["cudnn"]()[0]
    got = fns["autows"]()[0]
    err = ((got.float() - ref.float()).norm() / ref.float().norm()).item()
    res = {}
    for _ in range(3):
        for n, f in fns.items():
            res.setdefault(n, []).append(do_bench(f, warmup=10, rep=60))
            res.setdefault(n + "_graph10", []).append(do_bench(graphed(f), warmup=5, rep=60) / 10)
    ms = {n: statistics.median(t) for n, t in res.items()}
    flops = 4 * B * H * s * s * d / (2 if causal else 1)
    kt = {n: kernel_times(f) for n, f in fns.items()}
    name = f"fwd-s{s}-d{d}{'-causal' * causal}"
    print(name, "err", round(err, 4), {n: round(flops / t / 1e9) for n, t in ms.items()}, kt, flush=True)
    return {"case": name, "ms": ms, "kernels_us": kt, "err": err}


def main() -> None:
    if "--fwd-tile" in sys.argv:
        sys.argv.remove("--fwd-tile")
        add_tile_variants()
        cc.generate = generate
        rows = [fwd_tile(s, d, c) for d in (256, 192) for s, c in ((1024, False), (1024, True), (4096, False),
                                                                  (4096, True), (16384, False))]
        path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.environ.get("OUT", "."), "fwd_tile.json")
        with open(path, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "forward": rows}, f,
                      indent=1)
        return
    if "--fwd-epilogue" in sys.argv:
        sys.argv.remove("--fwd-epilogue")
        add_fwd_variants()
        cc.generate = generate
        rows = [fwd_epilogue(s, d) for s, d in ((512, 128), (512, 64), (1024, 128), (4096, 128))]
        path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.environ.get("OUT", "."), "fwd_epilogue.json")
        with open(path, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "forward": rows}, f,
                      indent=1)
        return
    add_variants()
    cc.generate = generate
    rows = [case(s, 128) for s in (1024, 4096)]
    short = [(s, d, c) for s in (512, 1024) for d in (64, 128) for c in (False, True)] if "--fwd" in sys.argv else []
    fwd = [fwd_case(s, d, c) for s, d, c in short]
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.environ.get("OUT", "."), "attention_ablate.json")
    with open(path, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "backward": rows,
                   "forward": fwd}, f, indent=1)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
