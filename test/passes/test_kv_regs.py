"""K and V in registers in the attention backward (``Options.kv_regs``): each consumer reads its K and V rows from
SMEM into registers once a tile (``smem_read``), and S^T = K Q^T and dP^T = V dO^T take A from them, so a step reads
only Q and dO for those two mmas. Where dQ's mma (B = K) or the dK/dV TMA stores (staged in their slots) read the
slots later, they are released at the tile's end as before; else right after the reads, with the meeting and fence
of passes/README.md "Q in registers". The template, the same passes
and the interpreter against torch, and the one runtime config it fits without spills (d=64's two-CTA reduce pick);
measured next as a sweep variant (bench/results/sweeps/attention_bwd_configs.py ``bwd_64x64_dp1_c2_kvr``)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from torch_autows.codegen.compile import compile_as_launched, summary
from torch_autows.interp import interpret_report
from torch_autows.ir import walk
from torch_autows.passes import pipeline
from torch_autows.runtime.attention_bwd_configs import CONFIGS
from torch_autows.templates.attention_bwd import AttentionBwdRequest, build

C2 = replace(CONFIGS["bwd_64x64_dp1_c2"], kv_regs=True)


def test_template_reads_k_and_v_once_and_their_first_mmas_take_them():
    p = build(AttentionBwdRequest(64, "bf16", False, dq="reduce"), C2)
    reads = [(o.operands[0], o.results[0].name) for o in p.body if o.kind == "smem_read"]
    assert reads == [("k", "kr"), ("v", "vr")]
    mmas = {o.results[0].name: o.operands for o in walk(p.body) if o.kind == "mma"}
    assert mmas["st"][0] == "kr" and mmas["dpt"][0] == "vr" and mmas["dq"][1] == "k"  # dQ = dS K: K from SMEM
    plain = build(AttentionBwdRequest(64, "bf16", False, dq="reduce"), replace(C2, kv_regs=False))
    assert not [o for o in walk(plain.body) if o.kind == "smem_read" and o.operands[0] in ("k", "v")]


@pytest.mark.parametrize("causal,dq,persistent", [(False, "reduce", False), (True, "reduce", True),
                                                  (True, "none", False)])
def test_matches_torch_under_every_policy(causal, dq, persistent):
    opts = replace(C2, persistent=persistent, stages=2, ctas_per_sm=1)
    before = build(AttentionBwdRequest(64, "f32", causal, dq=dq), opts)
    after = pipeline.run(before, verify=True, dump_dir="")
    ok, report = interpret_report(before, after, seeds=2)
    assert ok, report
    # K's slot outlives the reads where dQ's mma takes K: released at the tile's end, no meeting; in the separate
    # form (no dQ, dK/dV by pointer) the reads are K's and V's last: released right after, with the meeting
    synced = [o for pt in after.partitions for o in walk(pt.body) if o.kind == "release" and o.attr("sync")]
    assert bool(synced) == (dq == "none")


def test_the_two_cta_reduce_config_compiles_without_spills():
    for causal in (False, True):
        p = pipeline.run(build(AttentionBwdRequest(64, "bf16", causal, dq="reduce"), C2))
        s = summary(p, compile_as_launched(p))
        assert s["spills"] == 0 and not s["wgmma_serialized"] and s["wgmma_waits_injected"] == 0, s
