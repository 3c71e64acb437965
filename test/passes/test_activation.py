"""The activation epilogue (templates.gemm ``GemmRequest.activation``): C = gelu(A @ B (+ bias)) in one kernel.

The template's IR (a ``gelu`` op on the fp32 sum after the bias, before the one cast), the refused combinations,
the interpreter's gelu against torch's at extreme values, and GEMM configs interpreted under the partition
policies against torch (a split-K decode config included: gelu is applied once, to the reduced sum)."""
from __future__ import annotations

import pytest
import torch

from torch_autows.interp import POLICIES, make_instance, run_partitioned, run_sequential
from torch_autows.ir import Options, format_program, parse_program, walk
from torch_autows.passes import pipeline
from torch_autows.runtime import gemm as rt
from torch_autows.templates.gemm import GemmRequest, build
from torch_autows.verify import check

SMALL = Options(block_m=128, block_n=64, block_k=32, stages=3, data_partition=2, persistent=True)


def _lines(program) -> list[str]:
    return [ln.strip() for ln in format_program(program).splitlines()]


def test_request():
    # the default keeps the request's printed form (golden case names and kernel names are built from it)
    assert "activation" not in repr(GemmRequest(1, 1, 1, bias=True))
    assert "activation='gelu_tanh'" in repr(GemmRequest(1, 1, 1, activation="gelu_tanh"))
    with pytest.raises(ValueError, match="activation 'relu' not served; use one of none, gelu_tanh, gelu"):
        GemmRequest(1, 1, 1, activation="relu")
    with pytest.raises(ValueError, match="takes no residual and no swiglu"):
        GemmRequest(1, 1, 1, activation="gelu", residual=True)
    with pytest.raises(ValueError, match="takes no residual and no swiglu"):
        GemmRequest(1, 1, 1, activation="gelu", epilogue="swiglu")
    assert build(GemmRequest(1, 1, 1, bias=True, activation="gelu_tanh"), SMALL).name \
        == "gemm_bf16_nn_128x64x32_bias_gelu_tanh"


@pytest.mark.parametrize("act,approx", [("gelu_tanh", "tanh"), ("gelu", "none")])
def test_template_ir(act, approx):
    lines = _lines(build(GemmRequest(1, 1, 1, bias=True, trans_b=True, activation=act), SMALL))
    tail = lines[lines.index("}"):]  # after the loop, in order: bias, the activation, one cast, the store
    assert tail[3:7] == ["%acc_bias:f32[128,64] = add(%acc_out, %bias_row)",
                         f"%acc_act:f32[128,64] = gelu(%acc_bias) {{approximate='{approx}'}}",
                         "%out:bf16[128,64] = cast(%acc_act)",
                         "store(%out) {arg='c', coords=('pid_m*128', 'pid_n*64')}"]
    check(parse_program(format_program(build(GemmRequest(1, 1, 1, activation=act), SMALL))), "template")
    # without a bias it reads the accumulator
    nb = _lines(build(GemmRequest(1, 1, 1, activation=act), SMALL))
    assert f"%acc_act:f32[128,64] = gelu(%acc_out) {{approximate='{approx}'}}" in nb


def test_split_k_applies_it_after_the_reduction():
    p = pipeline.run(build(GemmRequest(1, 1, 1, bias=True, activation="gelu_tanh"), rt.CONFIGS["dec_64x128_s2"]))
    lines = _lines(p)
    consumer = lines[lines.index("code consumer0 {"):lines.index("code producer {")]
    red = next(i for i, ln in enumerate(consumer) if "= split_reduce(" in ln)
    act = next(i for i, ln in enumerate(consumer) if "= gelu(" in ln)
    assert red < act and sum("= gelu(" in ln for ln in consumer) == 1


@pytest.mark.parametrize("config", ["ws_p_128x128", "ws_np_128x256", "dec_64x128_s2", "dec_128x128_s3"])
@pytest.mark.parametrize("act", ["gelu_tanh", "gelu"])
def test_config_matches_torch(config, act):
    for seed, variant in enumerate([{"bias": True, "trans_b": True}, {"trans_a": True, "dtype": "fp16",
                                                                      "out_dtype": "f32"}]):
        before = build(GemmRequest(1, 1, 1, activation=act, **variant), rt.CONFIGS[config])
        after = pipeline.run(before, verify=True)
        inst = make_instance(after, seed)
        assert "gelu" in inst.desc
        assert torch.equal(run_sequential(before, inst.inputs())["c"], inst.reference["c"]), inst.desc
        policy = POLICIES[seed % len(POLICIES)]
        out = run_partitioned(after, inst.inputs(), policy=policy, seed=seed, nprog=2 + seed)
        assert torch.equal(out["c"], inst.reference["c"]), (policy, inst.desc)


def test_reference_is_torchs_gelu_of_the_biased_sum():
    before = build(GemmRequest(1, 1, 1, bias=True, activation="gelu_tanh"), rt.CONFIGS["dec_128x128_s3"])
    after = pipeline.run(before)
    inst = make_instance(after, 0, shape=(5, 24, 400))
    a, b, bias = (inst.tensors[n].float() for n in ("a", "b", "bias"))
    ref = torch.nn.functional.gelu(a @ b + bias, approximate="tanh").to(torch.bfloat16)
    assert torch.equal(inst.reference["c"], ref)
    assert not torch.equal(ref, (a @ b + bias).to(torch.bfloat16))  # the activation changes the numbers
    out = run_partitioned(after, inst.inputs(), policy="adversarial", seed=1, nprog=3)
    assert torch.equal(out["c"], inst.reference["c"])
    assert sum(o.kind == "gelu" for o in walk(after.partition("consumer0").body)) == 1
