"""Sequential semantics: TMA-like global memory, the op registry, and GEMM Programs at every stage vs torch."""
from __future__ import annotations

import pytest
import torch
from programs import small_gemm

from torch_autows.interp import InterpError, make_instance, run_sequential, semantics
from torch_autows.interp.machine import MBarrier
from torch_autows.interp.ops import SEMANTICS, tma_load, tma_store
from torch_autows.ir import parse_program
from torch_autows.passes import pipeline


def test_tma_load_zero_fills_outside_the_tensor():
    t = torch.arange(12.0).view(3, 4)
    box = tma_load(t, (2, 2), (2, 4))
    assert box.tolist() == [[10.0, 11.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]
    assert tma_load(t, (5, 0), (2, 2)).abs().sum() == 0


def test_tma_store_clips_at_the_bounds():
    t = torch.zeros(3, 4)
    tma_store(t, (2, 3), torch.ones(2, 2))
    assert t.sum() == 1 and t[2, 3] == 1


@pytest.mark.parametrize("step", [name for name, _ in pipeline.PIPELINE[:5]] + ["template"])
@pytest.mark.parametrize("variant", [{}, {"trans_a": True, "bias": True}, {"trans_b": True, "out_dtype": "f32"},
                                     {"batch": 2, "dtype": "fp16"}])
def test_gemm_after_each_pass_matches_torch(step, variant):
    trace: list = []
    pipeline.run(small_gemm(**variant), trace=trace)
    program = dict(trace)[step]
    for seed in range(2):
        inst = make_instance(program, seed)
        out = run_sequential(program, inst.inputs())
        assert torch.equal(out["c"], inst.reference["c"]), (step, inst.desc)


def test_odd_shape_tails_match_torch():
    program = small_gemm(bias=True)
    for shape in [(1, 8, 8), (129, 72, 33), (255, 64, 97)]:
        inst = make_instance(program, 0, shape=shape)
        assert torch.equal(run_sequential(program, inst.inputs())["c"], inst.reference["c"]), shape


_ELEMENTWISE = """\
program ew
  arg x: tensor<f32>[R, C]
  arg y: tensor<f32>[R, C] out
  arg v: tensor<f32>[R, C] out
  arg R: i32
  arg C: i32
  grid (pid: 1) persistent=False group=8
  body {
    %a:f32[4,8]@smem = load() {arg='x', coords=(0, 0)}
    %m:f32[4] = reduce_max(%a) {axis=1}
    %me:f32[4,1] = expand(%m) {axis=1}
    %d:f32[4,8] = sub(%a, %me)
    %e:f32[4,8] = exp2(%d)
    %s:f32[4] = reduce_sum(%e) {axis=1}
    %se:f32[4,1] = expand(%s) {axis=1}
    %n:f32[4,1] = neg(%se)
    %p:f32[4,8] = mul(%e, %n)
    %q:f32[4,8] = max(%p, %a)
    %w:f32[4,8] = where(%a, %q, %e)
    %z:f32[4,8] = add(%w, %a)
    store(%z) {arg='y', coords=(0, 0)}
    %h:bf16[4,8] = cast(%e)
    %hf:f32[4,8] = cast(%h)
    store(%hf) {arg='v', coords=(0, 0)}
  }
"""


def test_elementwise_and_reductions():
    x = torch.randn(4, 8)
    x[0, 0] = 0.0
    y, v = torch.zeros(4, 8), torch.zeros(4, 8)
    run_sequential(parse_program(_ELEMENTWISE), {"x": x, "y": y, "v": v, "R": 4, "C": 8})
    e = torch.exp2(x - x.amax(1, keepdim=True))
    q = torch.maximum(e * -e.sum(1, keepdim=True), x)
    torch.testing.assert_close(y, torch.where(x != 0, q, e) + x)
    assert torch.equal(v, e.to(torch.bfloat16).float())


def test_load_vec_is_masked():
    program = small_gemm(bias=True)
    inst = make_instance(program, 0, shape=(128, 40, 64))  # bias has 40 elements, the tile reads 64
    assert torch.equal(run_sequential(program, inst.inputs())["c"], inst.reference["c"])


def test_unknown_op_kind_is_named():
    text = _ELEMENTWISE.replace("neg(%se)", "frobnicate(%se)")
    with pytest.raises(InterpError, match="no semantics for op kind 'frobnicate'.*@semantics"):
        run_sequential(parse_program(text), {"x": torch.randn(4, 8), "y": torch.zeros(4, 8), "v": torch.zeros(4, 8),
                                             "R": 4, "C": 8})


def test_new_kinds_register_with_one_function():
    @semantics("twice")
    def _twice(ctx, o, args):
        return args[0] * 2

    try:
        text = _ELEMENTWISE.replace("neg(%se)", "twice(%se)")
        y = torch.zeros(4, 8)
        x = torch.ones(4, 8)
        run_sequential(parse_program(text), {"x": x, "y": y, "v": torch.zeros(4, 8), "R": 4, "C": 8})
        assert torch.isfinite(y).all()
    finally:
        del SEMANTICS["twice"]


def test_missing_or_mistyped_inputs():
    program = small_gemm()
    inst = make_instance(program, 0)
    inputs = inst.inputs()
    del inputs["b"]
    with pytest.raises(InterpError, match="missing input"):
        run_sequential(program, inputs)
    inputs = inst.inputs()
    inputs["a"] = inputs["a"].float()
    with pytest.raises(InterpError, match="declares bf16"):
        run_sequential(program, inputs)


def test_mbarrier_phases_and_parity():
    bar = MBarrier("b", 2)
    assert bar.passes(1) and not bar.passes(0)  # fresh: phase 0 in progress, "phase -1" counts as done
    assert bar.arrive("p") is None and not bar.passes(0)
    assert "twice" in bar.arrive("p")
    assert bar.arrive("q") is None and bar.passes(0) and bar.completed == 1
    ready = MBarrier("r", 1)
    assert ready.expect(100, "producer") is None and not ready.passes(0)
    assert ready.complete_tx(60) is None and not ready.passes(0)
    assert ready.complete_tx(40) is None and ready.passes(0)
    assert ready.expect(10, "producer") is None
    assert "more than its expect" in ready.complete_tx(20)
