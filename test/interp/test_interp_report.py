"""``interpret_report``: the API behind ``python -m torch_autows explain gemm ... --interpret --seeds N``."""
from __future__ import annotations

from dataclasses import replace

from programs import small_gemm

from torch_autows.interp import interpret_report
from torch_autows.ir import format_program, parse_program
from torch_autows.passes import pipeline


def _pair(**kw):
    trace: list = []
    after = pipeline.run(small_gemm(**kw), trace=trace)
    return trace[0][1], after


def test_report_ok():
    before, after = _pair(bias=True)
    ok, report = interpret_report(before, after, seeds=3, policies=("round_robin", "adversarial"))
    assert ok, report
    lines = report.splitlines()
    assert lines[0].startswith("interpret gemm_bf16_nn_128x64x32_bias: 3 seeds x 2 policies")
    assert "2 persistent CTAs; partitions consumer0, consumer1, producer; rings g0: 3 slots" in report
    assert any(ln.strip().startswith("sequential (before partitioning)   3/3 ok") for ln in lines)
    assert any(ln.strip().startswith("partitioned adversarial") and "3/3 ok" in ln for ln in lines)
    assert lines[-1] == "result: OK: every run matches torch, no schedule violation"


def test_report_shows_the_violation_trace():
    before, after = _pair()
    g = after.groups[0]
    broken = replace(after, groups=(replace(g, count=1),))  # the ring says 1 slot; buffers keep 3
    ok, report = interpret_report(before, broken, seeds=2)
    assert not ok
    assert "0/2 ok" in report and "FIRST FAILURE of partitioned round_robin" in report
    assert "violation [" in report and "last 40 events:" in report and report.endswith("result: FAILED")


def test_report_sequential_only_and_fixed_shape():
    before, _ = _pair(trans_b=True)
    ok, report = interpret_report(before, None, seeds=1, shape=(130, 72, 40))
    assert ok and "M=130 N=72 K=40" in report and "partitioned" not in report


def test_report_on_a_program_without_instance_maker():
    before, after = _pair()
    # hand-written IR (no template line): the interpreter looks makers up by template, not by argument names
    text = "\n".join(ln for ln in format_program(after).splitlines() if ln.strip() != "template gemm")
    ok, report = interpret_report(None, parse_program(text), seeds=1)
    assert not ok and "no instance maker" in report and "hand-written IR" in report
    wrong = format_program(after).replace("arg K: i32", "arg L: i32")  # the template's signature broken
    ok, report = interpret_report(None, parse_program(wrong), seeds=1)
    assert not ok and "lacks the template's args" in report


def test_report_for_attention():
    from torch_autows.runtime.attention import CONFIGS
    from torch_autows.templates.attention import AttentionRequest, build

    before = build(AttentionRequest(64, causal=True), CONFIGS["ws_p_128x128"])
    ok, report = interpret_report(before, pipeline.run(before), seeds=2)
    assert ok, report
    assert "attn_fwd_bf16_d64_128x128_causal" in report and "causal" in report.splitlines()[2]


def test_report_with_nothing_run_fails():
    before, after = _pair()
    for kw in ({"seeds": 0}, {"seeds": -2}):
        ok, report = interpret_report(before, after, **kw)
        assert not ok and "0/0 ok" in report and "OK" not in report.splitlines()[-1]
        assert report.splitlines()[-1].startswith("result: FAILED: NOTHING RUN for sequential (before partitioning)")
    ok, report = interpret_report(None, after, seeds=1, policies=())
    assert not ok and report.endswith("result: FAILED: NOTHING RUN for partitioned (no policy given) (1 seeds x 0 "
                                      "policies); pass seeds >= 1 and at least one policy")


def test_fit_shape_gemm():
    from torch_autows.interp.report import BUDGET, fit_shape

    _, after = _pair()  # 128x64x32 tiles, 3-slot ring
    assert fit_shape(after, (130, 72, 40)) == ((130, 72, 40), None)
    shape, note = fit_shape(after, (4000, 1000, 1000))
    assert shape == (256 + 4000 % 128, 64 + 1000 % 64, 4 * 32 + 1000 % 32)  # 3 x 2 tiles, 5 K steps, same tails
    assert note.startswith(f"interpreting M={shape[0]} N={shape[1]} K={shape[2]} instead of the requested M=4000")
    assert f"budget of {BUDGET}" in note and "3-slot ring" in note
    _, batched = _pair(batch=2)
    shape, note = fit_shape(batched, (100, 64, 40))
    assert shape == (128, 64, 64) and "batched GEMM needs M and K in whole 128x32 tiles" in note


def test_fit_shape_attention():
    from torch_autows.interp.report import fit_shape
    from torch_autows.runtime.attention import CONFIGS
    from torch_autows.templates.attention import AttentionRequest, build

    prog = build(AttentionRequest(64, causal=True), CONFIGS["ws_p_128x128"])
    assert fit_shape(prog, (2, 4, 2, 200, 300)) == ((2, 4, 2, 200, 300), None)
    shape, note = fit_shape(prog, (4, 32, 8, 4096, 1000))
    assert shape == (1, 4, 2, 128 + 128, 256 + 1000 % 128)
    assert "instead of the requested batch=4 Hq=32 Hkv=8 Sq=4096 Skv=1000" in note
    assert fit_shape(prog, (1, 16, 16, 300, 300))[0] == (1, 2, 2, 172, 172)  # equal lengths stay equal
