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
