"""Probe (not a test; run by hand, offline, no GPU): where the separate form's 64-query steps at d=128
(``bwd_64x128_dp2``, ``dq="none"``) spilled, and what ``templates/attention_bwd.py`` ``folds_rows`` does about it.

Findings (ptxas -v, sm_90a, bf16 = fp16; the source edits below, each compiled as ``probe_dq_split.compile_probe``):

* The loop body is a few registers over the consumers' 240: most spill bytes are loop-invariant scalars stored before
  the loop and reloaded in it or in the dK/dV epilogue (1-2 LDL a step without the mask, more with it). What is live
  at the peak (after the dV mma's issue): dK and dV (64 registers each), P^T in bf16 as dV's A operand (16), P^T in
  fp32 (32), dP^T (32) and delta (16), plus lse2 (16) from the step's top to exp2: the two per-column vectors are 16
  registers each in the transposed frame (a thread holds 16 of the 64 query columns; FA3's frame holds 2 rows).
* Removing the vectors (loads replaced by zeros) alone gives 0 bytes, causal or not; lse2 alone 12 / 240 (causal).
  Loading them later, computing dS^T before the dV issue, one compare per score in the mask, 64-bit row pointers in
  the epilogue (``store_ptr(row_ptr=True)``) or naming the step's q-head and Q block once: no better than 180 / 524,
  often worse (the allocator is at its limit and moves by tens of bytes either way).
* Folding them into the accumulators (``folds_rows``): S^T starts at -lse2/c and dP^T at -delta, so both vectors die
  when their mmas are issued: 0 bytes causal or not. lse2 alone folded: 40 / 248; delta alone: 0 / 120.
* Cost to check on the H200: with delta in dP^T's initial accumulator, ptxas reports ``C7517 warpgroup.wait is
  injected`` in one consumer: it hoists the S^T scaling above dP^T's issue and waits for S^T there (the other consumer
  keeps S^T and dP^T back to back). Folding only lse2 (issued first, nothing in flight) is free of it but spills.
  Cause, found since: the broadcast initial value is one SSA value in a thread's two rows, copied into dP^T's tied
  accumulator registers right before its wgmma, under S^T; codegen/sm90.py ``_zeros`` emits the fold's base as signed
  zeros per row (no copies, no injected wait), so ``fold`` here no longer shows it.

Usage, from the repository root: ``python test/codegen/probe_fold_rows.py``: for each variant (``fold``: the template
as it is; ``lse_only``: delta unfolded again; ``unfolded``: ``folds_rows`` off, the old form), causality and dtype, the
spill bytes and whether ptxas injected a warpgroup.wait.
"""
from __future__ import annotations

import os
import re
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [_HERE, os.path.dirname(os.path.dirname(_HERE))]  # probe_dq_split, and this checkout's torch_autows

from probe_dq_split import compile_probe  # noqa: E402

import torch_autows.templates.attention_bwd as template  # noqa: E402
from torch_autows.codegen import gluon  # noqa: E402
from torch_autows.codegen.compile import ptxas_info, signature  # noqa: E402
from torch_autows.passes import pipeline  # noqa: E402
from torch_autows.runtime.attention_bwd import CONFIGS  # noqa: E402


def source(causal: bool, dtype: str, fold: bool = True) -> tuple[str, dict]:
    """(Gluon source, signature) of the separate form's 64-query steps at d=128, folded (``bwd_64x128_dp2_fold``) or
    not (``bwd_64x128_dp2``)."""
    req = template.AttentionBwdRequest(128, dtype, causal, dq="none")
    p = pipeline.run(template.build(req, CONFIGS["bwd_64x128_dp2_fold" if fold else "bwd_64x128_dp2"]))
    return gluon.generate(p), signature(p)


def lse_only(src: str) -> str:
    """The folded source with dP^T zero-initialised again and delta subtracted after its wait."""
    for c in (0, 1):
        src = re.sub(rf"(v_dd_c{c} = warpgroup_mma\(v_v_c{c}, v_dot_c{c}, )v_d0_c{c}, ",
                     r"\1gl.zeros([64, 64], gl.float32, MMA_N64), use_acc=False, ", src)
        src = src.replace(f"v_dst_c{c} = v_pt_c{c} * v_dd_c{c}_w",
                          f"v_dst_c{c} = v_pt_c{c} * (v_dd_c{c}_w - v_dr_c{c})")
    return src


def measure(src: str, sig: dict) -> dict:
    """Spill bytes and whether ptxas injected a warpgroup.wait (C7517) into the compiled source."""
    r = compile_probe(src, sig, with_ptx=True)
    return {"spills": r["spills"], "injected_wait": "C7517" in ptxas_info(r["ptx"])["log"]}


if __name__ == "__main__":
    for causal in (False, True):
        for dtype in ("bf16", "fp16"):
            folded = source(causal, dtype)
            for name, (src, sig) in (("fold", folded), ("lse_only", (lse_only(folded[0]), folded[1])),
                                     ("unfolded", source(causal, dtype, fold=False))):
                print(name, dtype, "causal" if causal else "non-causal", measure(src, sig), flush=True)
