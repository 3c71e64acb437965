"""The verifier catches broken invariants (each made by editing a valid Program's text)."""
from __future__ import annotations

import pytest
from programs import small_gemm

from torch_autows.ir import format_program, parse_program
from torch_autows.passes import pipeline
from torch_autows.verify import VerifyError, check


def _text(stage):
    trace = []
    pipeline.run(small_gemm(), trace=trace)
    return dict(trace)[stage]


def _broken(stage, old, new, count=1):
    text = format_program(_text(stage))
    assert old in text, old
    return parse_program(text.replace(old, new, count))


def test_valid_program_passes_every_stage():
    trace = []
    pipeline.run(small_gemm(bias=True, trans_a=True), trace=trace)
    for name, p in trace:
        check(p, name)


def test_use_before_def():
    p = _broken("template", "mma(%a, %b, %acc)", "mma(%a, %nowhere, %acc)")
    with pytest.raises(VerifyError, match="%nowhere used before it is defined"):
        check(p, "template")


def test_chains_must_not_share_values():
    p = _broken("data_partition", "mma(%a_c1, %b, %acc_c1)", "mma(%a_c0, %b, %acc_c1)")
    with pytest.raises(VerifyError, match="chain 1 reads %a_c0 of chain 0"):
        check(p, "data_partition")


def test_use_at_earlier_stage_than_def():
    p = _broken("loop_schedule", "{pending=1} [chain=0 stage=1", "{pending=1} [chain=0 stage=0")
    with pytest.raises(VerifyError, match="before its def's stage"):
        check(p, "loop_schedule")


def test_every_op_needs_a_partition():
    p = _broken("partition_schedule", "partition=consumer1 stage=1", "partition=nobody stage=1")
    with pytest.raises(VerifyError, match="'nobody'"):
        check(p, "partition_schedule")


def test_register_budget():
    p = _broken("partition_schedule", "partition consumer1 warps=4 regs=232", "partition consumer1 warps=4 regs=256")
    with pytest.raises(VerifyError, match="registers"):
        check(parse_program(format_program(p).replace("consumer0 warps=4 regs=232", "consumer0 warps=4 regs=256")),
              "partition_schedule")


def test_cross_partition_value_needs_channel():
    p = _broken("buffers", "  channel ch_b: %b producer -> consumer0,consumer1",
                "  channel ch_b: %b producer -> consumer0")
    with pytest.raises(VerifyError, match="%b crosses from producer to consumer1 without a channel"):
        check(p, "buffers")


def test_smem_limit():
    text = format_program(_text("memory_plan"))
    import re

    p = parse_program(re.sub(r"  smem \d+", "  smem 300000", text))
    with pytest.raises(VerifyError, match="exceeds the limit"):
        check(p, "memory_plan")


def test_overlapping_buffers():
    import re

    text = re.sub(r"(value=%a_c1 count=3 offset=)\d+", r"\g<1>1024", format_program(_text("memory_plan")))
    with pytest.raises(VerifyError, match="overlap"):
        check(parse_program(text), "memory_plan")


def test_dropped_release_is_caught():
    tail = "      advance() {group='g0'}\n      yield(%acc_next_c1)"
    p = _broken("code_partition", "      release() {group='g0', lag=1}\n" + tail, tail)
    with pytest.raises(VerifyError, match="released 0 times|releasing partitions"):
        check(p, "code_partition")


def test_unbalanced_advance_is_caught():
    p = _broken("code_partition", "      advance() {group='g0'}\n      yield()", "      yield()")
    with pytest.raises(VerifyError, match="phases would drift"):
        check(p, "code_partition")


def test_stages_are_the_pipelines():
    """The verifier knows exactly the template's stage and each pass of PIPELINE (no second list to keep)."""
    assert pipeline.STAGES == ("template", *(n for n, _ in pipeline.PIPELINE))
    trace = []
    pipeline.run(small_gemm(), trace=trace)
    assert tuple(n for n, _ in trace) == pipeline.STAGES
    with pytest.raises(ValueError, match="unknown stage 'codegen'; the stages are template, data_partition"):
        check(trace[-1][1], "codegen")


def _attention(config="ws_p_128x128"):
    from torch_autows.runtime.attention import CONFIGS
    from torch_autows.templates.attention import AttentionRequest, build

    trace = []
    pipeline.run(build(AttentionRequest(64, "bf16", True), CONFIGS[config]), trace=trace)
    return dict(trace)


def test_loop_spanning_two_stages_must_be_pipelined():
    """code_partition's loop runs P V in the step of its softmax: fine there, not after software_pipeline."""
    lowered = _attention()["code_partition"]
    check(lowered, "code_partition")
    with pytest.raises(VerifyError, match="must be software pipelined"):
        check(lowered, "software_pipeline")


def _edit(p, part, fn):
    """``p`` with ``fn(ops) -> ops`` applied to each op list (top level and loop bodies) of partition ``part``."""
    from dataclasses import replace

    def visit(ops):
        return tuple(fn([replace(o, body=visit(o.body)) if o.body else o for o in ops]))
    return replace(p, partitions=tuple(replace(pt, body=visit(pt.body)) if pt.name == part else pt
                                       for pt in p.partitions))


def test_turns_are_checked():
    from dataclasses import replace

    pp = _attention("ws_p_128x128_q2_pp")["ping_pong"]
    check(pp, "ping_pong")
    with pytest.raises(VerifyError, match="no turn barriers"):
        check(replace(pp, turns=None), "ping_pong")
    with pytest.raises(VerifyError, match="starts a loop inside a turn"):
        check(_edit(pp, "consumer1", lambda ops: [o for o in ops if o.kind != "turn_pass"]), "ping_pong")
    with pytest.raises(VerifyError, match="outside a turn"):
        check(_edit(pp, "consumer0", lambda ops: [o for o in ops if o.kind not in ("turn_wait", "turn_pass")]),
              "ping_pong")
    with pytest.raises(VerifyError, match=r"needs \{'turns': 2, 'me': 1\}"):
        check(_edit(pp, "consumer1", lambda ops: [o.with_attrs(me=0) if o.kind == "turn_wait" else o for o in ops]),
              "ping_pong")

    def one_less(ops):  # consumer1 issues its prologue's Q K^T without taking the turn, consumer0 takes it
        if any(o.kind == "loop" for o in ops):
            i = next(i for i, o in enumerate(ops) if o.kind == "turn_wait")
            j = next(j for j, o in enumerate(ops) if o.kind == "turn_pass")
            return ops[:i] + ops[i + 1:j] + ops[j + 1:]
        return ops
    with pytest.raises(VerifyError, match="outside a turn"):
        check(_edit(pp, "consumer1", one_less), "ping_pong")
    with pytest.raises(VerifyError, match="consumer1 takes turns but is not in turns"):
        check(replace(pp, turns=replace(pp.turns, partitions=("consumer0", "producer"))), "ping_pong")
    with pytest.raises(VerifyError, match="take different turns per tile"):  # consumer1's loop runs twice as long
        check(_edit(pp, "consumer1", lambda ops: [o.with_attrs(ub="2*" + o.attr("ub")) if o.kind == "loop" else o
                                                  for o in ops]), "ping_pong")
