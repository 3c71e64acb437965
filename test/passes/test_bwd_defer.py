"""The attention backward's step with its carried-accumulator mmas deferred a step (``Options.defer_mma``):
loop_schedule moves dV += P^T dO and dK += dS^T Q (the dQ kernel: dQ += dS K) one stage later, and
software_pipeline issues step j's leading mmas (S^T and dP^T: neither reads the other) back to back with step j-1's
deferred ones, each leading mma retired right before its first reader, so the tensor core runs the deferred GEMMs
under step j's softmax and dS. Checked here: the emitted order and wait counts, every interpreter policy against
torch (main and dQ kernels, causal or not), a release moved before the wait that retires its slot's reader (the defect
the interpreter caught while this was written) caught in every run, and offline sm_90a compiles. The forward's
deferred P V (one leading mma) is unchanged: its golden hashes (test_golden_hashes.py) hold."""
from __future__ import annotations

from dataclasses import replace

import pytest
from programs import violation_kinds

from torch_autows.interp import POLICIES, interpret_report
from torch_autows.ir import Options, walk
from torch_autows.passes import PassError, pipeline
from torch_autows.runtime import attention_bwd as rt
from torch_autows.templates.attention_bwd import AttentionBwdRequest, build
from torch_autows.templates.attention_bwd_dq import AttentionBwdDqRequest
from torch_autows.templates.attention_bwd_dq import build as build_dq

MAIN = replace(rt.CONFIGS["bwd_64x128_dp2"], defer_mma=True, stages=3)
DQ = replace(rt.DQ_CONFIGS["dq_128x128_dp2_p"], defer_mma=True)
DQ64 = replace(rt.DQ_CONFIGS["dq_128x64_dp2"], defer_mma=True, persistent=True)  # 64 keys a step


def _steady(program, partition="consumer0"):
    """The consumer's pipelined loop body (the one with lagged gets)."""
    part = next(p for p in program.partitions if p.name == partition)
    return next(o for o in walk(part.body) if o.kind == "loop" and any(x.attr("lag") == 1 for x in o.body))


def test_deferred_step_issues_the_leading_mmas_then_the_previous_steps_and_waits_at_the_readers():
    after = pipeline.run(build(AttentionBwdRequest(64, "bf16", False, dq="none"), MAIN))
    body = _steady(after).body
    mmas = [(o.results[0].name, o.operands[0]) for o in body if o.kind == "mma"]
    assert [m for m, _ in mmas] == ["st_c0", "dpt_c0", "dv_new_c0", "dk_new_c0"]
    assert [a for _, a in mmas[2:]] == ["p16_c0_prev", "ds16_c0_prev"]  # step j-1's register operands, carried
    waits = {o.operands[0]: o.attr("pending") for o in body if o.kind == "mma_wait"}
    assert waits == {"st_c0": 3, "dpt_c0": 2, "dv_new_c0": 0, "dk_new_c0": 0}
    kinds = [o.kind for o in body]
    # S^T is retired only before its first reader, after the deferred mmas are issued; dP^T after the softmax's exp2
    assert kinds.index("mma_wait") > [i for i, k in enumerate(kinds) if k == "mma"][-1]
    dpt_wait = next(i for i, o in enumerate(body) if o.kind == "mma_wait" and o.operands[0] == "dpt_c0")
    assert kinds.index("exp2") < dpt_wait
    # step j-1's Q/dO slot is released after its dK retires: a lagged release, three slots
    rel = [i for i, o in enumerate(body) if o.kind == "release" and o.attr("lag") == 1]
    assert rel and rel[0] > max(i for i, o in enumerate(body) if o.kind == "mma_wait")
    assert next(b for b in after.buffers if b.value == "q").count == 3


@pytest.mark.parametrize("d,dt,causal,opts", [
    (64, "f32", True, Options(block_m=64, block_n=64, stages=2, data_partition=1, defer_mma=True)),
    (64, "bf16", True, MAIN), (128, "bf16", False, MAIN),
    (64, "fp16", False, replace(rt.CONFIGS["bwd_64x128_dp2_p"], defer_mma=True, stages=3))])
def test_deferred_main_kernel_matches_torch_under_every_policy(d, dt, causal, opts):
    before = build(AttentionBwdRequest(d, dt, causal, dq="none"), opts)
    ok, report = interpret_report(before, pipeline.run(before, verify=True, dump_dir=""), seeds=2)
    assert ok, report


@pytest.mark.parametrize("d,causal,bn", [(64, False, 128), (128, True, 128), (128, False, 64)])
def test_deferred_dq_kernel_matches_torch_under_every_policy(d, causal, bn):
    before = build_dq(AttentionBwdDqRequest(d, "bf16", causal), DQ if bn == 128 else DQ64)
    ok, report = interpret_report(before, pipeline.run(before, verify=True, dump_dir=""), seeds=2)
    assert ok, report


def test_a_release_before_its_readers_wait_is_caught():
    """The dQ kernel's V ring is read by the leading dP mma: its release must follow dP's wait. Moved to right after
    the deferred mmas' issue, before that wait, every run reports the slot released under an unretired wgmma."""
    after = pipeline.run(build_dq(AttentionBwdDqRequest(128, "bf16", False), DQ))
    loop = _steady(after)
    body = list(loop.body)
    v_group = next(o.attr("group") for o in body if o.kind == "get" and o.results[0].name.startswith("v"))
    i_rel = next(i for i, o in enumerate(body) if o.kind == "release" and o.attr("group") == v_group)
    i_wait = next(i for i, o in enumerate(body) if o.kind == "mma_wait" and o.operands[0].startswith("dp"))
    assert i_wait < i_rel
    rel, adv = body[i_rel], body[i_rel + 1]
    assert adv.kind == "advance"
    moved = body[:i_wait] + [rel, adv] + [o for k, o in enumerate(body[i_wait:], i_wait) if k not in (i_rel, i_rel + 1)]

    def patch(ops):
        return tuple(replace(o, body=tuple(moved)) if o is loop else replace(o, body=patch(o.body)) for o in ops)
    mutated = replace(after, partitions=tuple(replace(p, body=patch(p.body)) for p in after.partitions))
    kinds = violation_kinds(mutated, seeds=1, shape=(1, 2, 1, 200, 300))
    assert kinds == ["release-before-retire"] * len(POLICIES), kinds


@pytest.mark.parametrize("template,d,causal", [("main", 64, True), ("main", 64, False), ("dq", 64, False),
                                               ("dq64", 128, True)])
def test_deferred_kernels_compile_for_sm90a(template, d, causal):
    """d=64 without spills, and the dQ kernel at d=128 with 64 keys a step. (At d=128 the deferred step keeps step
    j-1's P^T and dS^T live beside step j's: the main kernel spills 926 bytes offline, the dQ kernel with 128 keys a
    step 1136; the runtime's d=128 picks do not defer.)"""
    from torch_autows.codegen.compile import compile_offline, summary

    program = pipeline.run(build(AttentionBwdRequest(d, "bf16", causal, dq="none"), MAIN) if template == "main"
                           else build_dq(AttentionBwdDqRequest(d, "bf16", causal), DQ if template == "dq" else DQ64))
    s = summary(program, compile_offline(program))
    assert [p["name"] for p in s["partitions"]] == ["consumer0", "consumer1", "producer"]
    assert s["spills"] == 0, s["spills"]


@pytest.mark.parametrize("dq", ["atomic", "reduce"])
def test_steps_storing_to_smem_are_refused(dq):
    """The atomic and reduce forms store dS into SMEM each step (for their dQ mma): a pipelined prologue would copy
    that store without a buffer, so they are refused with the reason, not miscompiled."""
    with pytest.raises(PassError, match="smem_store"):
        pipeline.run(build(AttentionBwdRequest(64, "bf16", False, dq=dq), replace(MAIN, dq_split=False)))
