"""The activation epilogue's Gluon code: the ``gelu`` emitter's expressions evaluated with torch stand-ins for
``gl.exp2`` / ``gl.erf`` match F.gelu in fp32 (no NaN or inf at any |x|, where a naive tanh would give inf/inf),
the generated epilogue applies it after the bias and before the cast, and the served configs compile offline to
sm_90a without spills (the refused configs spill: pinned, that is why they refuse it)."""
from __future__ import annotations

import types

import pytest
import torch
import torch.nn.functional as F
from programs import assert_in_order, compile_ws_cubin

from torch_autows.codegen import gluon
from torch_autows.codegen.compile import compile_offline, summary
from torch_autows.codegen.emitters import EMITTERS
from torch_autows.ir import TileType, Value, op
from torch_autows.passes import pipeline
from torch_autows.runtime.gemm import CONFIGS, serves_activation
from torch_autows.templates.gemm import GemmRequest, build

_GL = types.SimpleNamespace(exp2=torch.exp2, erf=torch.erf)


@pytest.mark.parametrize("approx", ["tanh", "none"])
def test_emitter_matches_torch_in_fp32(approx):
    o = op("gelu", [Value("y", TileType("f32", (64, 64)))], ["x"], approximate=approx)
    (line,) = EMITTERS["gelu"](None, o, 0)
    lhs, rhs = line.split(" = ", 1)
    x = torch.cat([torch.linspace(-30, 30, 6001), torch.tensor([-3e38, -1e30, -1e6, -100.0, 100.0, 1e6, 1e30, 3e38,
                                                                 0.0, -0.0, 1e-30, -1e-30])])
    got = eval(rhs, {"gl": _GL, lhs.replace("y", "x"): x})  # noqa: S307 (our own generated expression)
    want = F.gelu(x.double(), approximate=approx).float()
    assert not got.isnan().any() and (got.isinf() == want.isinf()).all()
    finite = want.isfinite()
    torch.testing.assert_close(got[finite], want[finite], rtol=2e-6, atol=1e-6)


def test_generated_epilogue():
    program = pipeline.run(build(GemmRequest(1, 1, 1, bias=True, trans_b=True, activation="gelu_tanh"),
                                 CONFIGS["ws_p_128x128"]))
    src = gluon.generate(program)
    ordered = ["def consumer0(", "v_acc_bias_c0 = v_acc_out_c0_done + v_bias_row_c0",
               "v_acc_act_c0 = v_acc_bias_c0 / (1.0 + gl.exp2((v_acc_bias_c0 + 0.044715 * v_acc_bias_c0",
               "v_out_c0 = v_acc_act_c0.to(gl.bfloat16)", "def consumer1(", "v_acc_act_c1 = ", "def producer("]
    assert_in_order(src, ordered)
    exact = gluon.generate(pipeline.run(build(GemmRequest(1, 1, 1, activation="gelu"), CONFIGS["dec_64x128_s2"])))
    assert "v_acc_act = 0.5 * v_acc_out_sum * (1.0 + gl.erf(v_acc_out_sum * 0.7071067811865476))" in exact


# A few cases (CI time): the GPT-2 c_fc layout (nt + bias) on a large, a 256-wide and a split-K decode config;
# every config was measured once (runtime/gemm.py's docstring)
@pytest.mark.parametrize("config,act,variant", [
    ("ws_p_128x256", "gelu_tanh", "nt_bias"), ("ws_p_128x128", "gelu", "nt_bias"),
    ("dec_128x128_s3", "gelu_tanh", "nt_bias"), ("dec_64x128_s2", "gelu", "tn_fp16_f32out"),
    ("dec_256x64_s2", "gelu_tanh", "tn_fp16_f32out")])
def test_compiles_without_spills(config, act, variant):
    assert serves_activation(config, act)
    ta, tb, bias, dt, odt = {"nt_bias": (False, True, True, "bf16", None),
                             "tn_fp16_f32out": (True, False, False, "fp16", "f32")}[variant]
    program = pipeline.run(build(GemmRequest(4096, 4096, 4096, dt, odt, ta, tb, bias, activation=act),
                                 CONFIGS[config]))
    compile_ws_cubin(program)


@pytest.mark.parametrize("config,act,out_dtype", [("ws_p_128x256", "gelu", None),
                                                  ("ws_np_128x256", "gelu_tanh", "f32")])
def test_refused_configs_would_spill(config, act, out_dtype):
    """Why serves_activation refuses these (if one compiles without spills, widen it)."""
    assert not serves_activation(config, act)
    program = pipeline.run(build(GemmRequest(4096, 4096, 4096, out_dtype=out_dtype, trans_b=True, bias=True,
                                             activation=act), CONFIGS[config]))
    assert summary(program, compile_offline(program))["spills"] > 0
