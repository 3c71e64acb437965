"""Probe (not a test; run by hand, offline, no GPU): would FlashAttention-3's split dQ make the attention backward's
reduce form spill-free at d=128? passes/BACKWARD.md §4 step 8 (b) has the numbers and the conclusion.

The split dQ form is not in the IR yet, so this probe writes it by hand into the Gluon that codegen generates today and
compiles that for sm_90a (``ptxas -v``, as ``compile.summary`` counts spills):

* ``split``: the reduce form of ``bwd_64x128_dp2`` (BM 64 x BN 128, two consumers of 64 keys). Each consumer stores its
  dS^T half into slot ``n % 2`` of its own SMEM tile, then all consumers meet on one mbarrier (count 2: Gluon's
  ``mbarrier.arrive`` is one elected thread after triton's partition-local ``bar.sync id, 128``; the wait is the phase
  parity ``n & 1``), then each computes dQ[:, half] over all 128 keys as two wgmmas, dS_c0 @ K_c0[:, half] +
  dS_c1 @ K_c1[:, half] (32 registers of dQ instead of 64), stages [BM, D/2] fp32 and reduces it at (row, half*D/2).
* ``swapab``: the separate form's ``bwd_32x128_dp2`` main kernel (BM 32: no dQ in the template, since wgmma's M is
  64) plus FA3's ``dQ_swapAB``: the same dS exchange, then dQ^T[half] = K[:, half]^T dS^T (M = 64 head-dim rows, 16
  registers), stored transposed into a [BM, 64] fp32 staging tile and reduced at (row, half*64).

Two slots of dS per consumer and one barrier per step are enough: a consumer rewrites slot s two steps later, after
passing the next step's barrier, which the other consumer reaches only after its step had retired every wgmma (the
step ends with ``wait(0)``). Usage: ``python test/codegen/probe_dq_split.py`` from the repository root.
"""
from __future__ import annotations

import importlib.util
import os
import re
import sys
import tempfile

from torch_autows.codegen import gluon
from torch_autows.codegen.compile import desc_layout, ptxas_info, signature
from torch_autows.passes import pipeline
from torch_autows.runtime.attention_bwd import CONFIGS
from torch_autows.templates.attention_bwd import AttentionBwdRequest, build

_BAR = ("    cbar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())\n"
        "    mbarrier.init(cbar.index(0), count=2)\n")


def _sync(c: int) -> list[str]:
    """Consumer c's dS^T half into its slot, then the per-step meeting of both consumers."""
    return [f"v_dss_c{c} = dss_c{c}_smem.index(sync_n % 2)", f"v_dss_c{c}.store(v_ds16_c{c})", "fence_async_shared()",
            "mbarrier.arrive(cbar.index(0))", "mbarrier.wait(cbar.index(0), sync_n & 1)"]


def _insert(src: str, pattern: str, lines: list[str], after: bool) -> str:
    m = re.search(pattern, src)
    ind = re.match(r" *", src[m.start():]).group(0)
    at = m.end() if after else m.start()
    return src[:at] + "".join(ind + x + "\n" for x in lines) + src[at:]


def split_source(causal: bool, dtype: str) -> tuple[str, dict]:
    """(Gluon source, signature) of ``bwd_64x128_dp2``'s reduce form at d=128 with the split dQ."""
    H = 64
    p = pipeline.run(build(AttentionBwdRequest(128, dtype, causal, dq="reduce"), CONFIGS["bwd_64x128_dp2"]))
    src = gluon.generate(p).replace("g1_ready, g1_empty)", "g1_ready, g1_empty, cbar)")
    src = re.sub(r"(dss_c\d_smem = gl.allocate_shared_memory\(gl.\w+, )\[64, (\d+)\]", r"\g<1>[2, 64, \2]", src)
    src = re.sub(r"(dq_c\d_stage = gl.allocate_shared_memory\(gl.float32, )\[(\d+), \d+\]", rf"\g<1>[\2, {H}]", src)
    src = src.replace("    g1_ready = gl.allocate", _BAR + "    g1_ready = gl.allocate", 1)
    for c in (0, 1):
        src = src.replace(f"    # partition consumer{c}: ", f"    sync_n = 0\n    # partition consumer{c}: ")
        old = re.search(r" +v_dss_c%d = dss_c%d_smem\n.*?v_dq_c%d = warpgroup_mma\([^\n]*\n" % (c, c, c), src, re.S)
        mmas = [f"v_dq_c{c} = warpgroup_mma(dss_c{x}_smem.index(sync_n % 2).permute((1, 0)), k_c{x}_smem.index(g1_s)"
                f".slice({c * H}, {H}, 1), {acc}, is_async=True)"
                for x, acc in ((0, f"gl.zeros([64, {H}], gl.float32, MMA_N{H}), use_acc=False"), (1, f"v_dq_c{c}"))]
        src = src[:old.start()] + _insert(old.group(0), r" +v_dss", [*_sync(c), *mmas, "sync_n += 1"], False)[
            :-len(old.group(0))] + src[old.end():]
        src = re.sub(r"(async_reduce_add_shared_to_global\(dq_acc_desc, \[[^\n]*), 0\], dq_c%d_stage\)" % c,
                     r"\1, %d], dq_c%d_stage)" % (c * H, c), src)
    sig = signature(p)
    sig["dq_acc_desc"] = f"tensordesc<fp32[64, {H}],{desc_layout((64, H), 'f32')!r}>"
    return src, sig


def swapab_source(causal: bool, dtype: str) -> tuple[str, dict]:
    """(Gluon source, signature) of the separate form's ``bwd_32x128_dp2`` at d=128 with FA3's split dQ^T."""
    p = pipeline.run(build(AttentionBwdRequest(128, dtype, causal, dq="none"), CONFIGS["bwd_32x128_dp2"]))
    src = gluon.generate(p).replace("delta_ptr, dk_ptr", "delta_ptr, dq_acc_desc, dk_ptr")
    src = src.replace("g1_ready, g1_empty)",
                      "g1_ready, g1_empty, dss_c0_smem, dss_c1_smem, dq_c0_stage, dq_c1_stage, cbar)")
    gty = {"bf16": "gl.bfloat16", "fp16": "gl.float16"}[dtype]
    alloc = "".join(f"    dss_c{c}_smem = gl.allocate_shared_memory({gty}, [2, 64, 32], gl.NVMMASharedLayout("
                    f"swizzle_byte_width=64, element_bitwidth=16, rank=2))\n    dq_c{c}_stage = gl.allocate_shared_"
                    f"memory(gl.float32, [32, 64], dq_acc_desc.layout)\n" for c in (0, 1))
    src = src.replace("    g1_ready = gl.allocate", alloc + _BAR + "    g1_ready = gl.allocate", 1)
    lo = "pid_n * 128 // 32" if causal else "0"
    t = f"(gl.cdiv(Sq, 32) - {lo})"
    row = f"(pid_bh // Hkv * Hq + (pid_bh % Hkv * G + j // {t})) * (gl.cdiv(Sq, 32) * 32) + ({lo} + j % {t}) * 32"
    for c in (0, 1):
        src = src.replace(f"    # partition consumer{c}: ", f"    sync_n = 0\n    # partition consumer{c}: ")
        mmas = [f"v_dqt_c{c} = warpgroup_mma(k_c{x}_smem.index(g1_s).slice({c * 64}, 64, 1).permute((1, 0)), "
                f"dss_c{x}_smem.index(sync_n % 2), {acc}, is_async=True)"
                for x, acc in ((0, "gl.zeros([64, 32], gl.float32, MMA_N32), use_acc=False"), (1, f"v_dqt_c{c}"))]
        src = _insert(src, r" +v_ds16_c%d = [^\n]*\n" % c, [*_sync(c), *mmas], True)
        src = src.replace(f"v_dv_new_c{c}_w, _ = warpgroup_mma_wait(num_outstanding=1,",
                          f"v_dv_new_c{c}_w, _ = warpgroup_mma_wait(num_outstanding=3,")
        src = _insert(src, r" +v_dk_new_c%d_w, _ = warpgroup_mma_wait\(num_outstanding=0" % c, [
            f"v_dqt_c{c} = warpgroup_mma_wait(num_outstanding=1, deps=(v_dqt_c{c},))", "tma.store_wait(0)",
            f"dq_c{c}_stage.permute((1, 0)).store(v_dqt_c{c})", "fence_async_shared()",
            f"async_reduce_add_shared_to_global(dq_acc_desc, [{row}, {c * 64}], dq_c{c}_stage)", "sync_n += 1"], False)
    src = src.replace("warpgroup_mma_wait)\n", "warpgroup_mma_wait)\nfrom torch_autows.codegen.gluon_ext import "
                      "async_reduce_add_shared_to_global\n", 1)
    sig = {}
    for k, v in signature(p).items():
        sig[k] = v
        if k == "delta_ptr":
            sig["dq_acc_desc"] = f"tensordesc<fp32[32, 64],{desc_layout((32, 64), 'f32')!r}>"
    return src, sig


def compile_probe(src: str, sig: dict, with_ptx: bool = False) -> dict:
    """Spill bytes, SMEM bytes and PTX counts of the hand-written kernel, compiled for sm_90a (and its PTX under
    ``"ptx"`` when asked)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "probe_kernel.py")
        with open(path, "w") as f:
            f.write(src)
        spec = importlib.util.spec_from_file_location("probe_kernel", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        k = triton.compile(GluonASTSource(mod.kernel, sig, {}), target=GPUTarget("cuda", 90, 32),
                           options={"num_warps": 4})
    ptx = k.asm["ptx"]
    r = {"spills": ptxas_info(ptx)["spills"], "smem": k.metadata.shared,
         "bulk_reduce": len(re.findall(r"cp\.reduce\.async\.bulk\.tensor", ptx)),
         "wgmma": len(re.findall(r"wgmma\.mma_async", ptx))}
    return {**r, "ptx": ptx} if with_ptx else r


if __name__ == "__main__":
    forms = sys.argv[1:] or ["split", "swapab"]
    for form in forms:
        for causal in (False, True):
            for dtype in ("bf16", "fp16"):
                make = {"split": split_source, "swapab": swapab_source}[form]
                print(form, "d128", dtype, "causal" if causal else "non-causal", compile_probe(*make(causal, dtype)))
