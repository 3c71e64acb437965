"""Every config that serves the residual epilogue (runtime.gemm.serves_residual) compiles offline to a sm_90a cubin
without spills (R's tile loaded into registers beside the accumulator), and the generated epilogue adds R in fp32
after the bias and before the cast; a 256-wide tile would spill, which is why those configs refuse it."""
from __future__ import annotations

import itertools

import pytest
from programs import assert_in_order, compile_ws_cubin

from torch_autows.codegen import gluon
from torch_autows.codegen.compile import compile_offline, summary
from torch_autows.passes import pipeline
from torch_autows.runtime.gemm import CONFIGS, serves_residual
from torch_autows.templates.gemm import GemmRequest, build

VARIANTS = {  # (trans_a, trans_b, bias, dtype, out_dtype)
    "nt_bias": (False, True, True, "bf16", None),  # nn.Linear weights (w.t() views) with a bias
    "tn_fp16_f32out": (True, False, False, "fp16", "f32"),
}


@pytest.mark.parametrize("config,variant", [(c, v) for c, v in itertools.product(CONFIGS, VARIANTS)
                                            if serves_residual(c)])
def test_compiles_without_spills(config, variant):
    ta, tb, bias, dt, odt = VARIANTS[variant]
    program = pipeline.run(build(GemmRequest(4096, 4096, 4096, dt, odt, ta, tb, bias, residual=True),
                                 CONFIGS[config]))
    compile_ws_cubin(program)


def test_a_256_wide_tile_would_spill():
    """Why serves_residual excludes 256-wide tiles (if this starts to pass without spills, widen it)."""
    program = pipeline.run(build(GemmRequest(4096, 4096, 4096, residual=True), CONFIGS["ws_np_128x256"]))
    assert summary(program, compile_offline(program))["spills"] > 0


def test_generated_epilogue():
    program = pipeline.run(build(GemmRequest(1, 1, 1, bias=True, residual=True), CONFIGS["ws_p_128x128"]))
    src = gluon.generate(program)
    ordered = ["def consumer0(", "v_acc_out_c0_done = warpgroup_mma_wait(num_outstanding=0",
               "v_acc_bias_c0 = v_acc_out_c0_done + v_bias_row_c0",
               "v_res_c0_r = gl.arange(0, 64, layout=MMA_N128_S1)",
               "v_res_c0_p = r_ptr + ((pid_m * 128 + v_res_c0_r).to(gl.int64) * (N))[:, None] + "
               "(pid_n * 128 + v_res_c0_c)[None, :]",
               "v_res_c0_m = (v_res_c0_r < M - pid_m * 128)[:, None] & (v_res_c0_c < N - pid_n * 128)[None, :]",
               "v_res_c0 = gl.load(v_res_c0_p, mask=v_res_c0_m, other=0.0).to(gl.float32)",
               "v_acc_res_c0 = v_acc_bias_c0 + v_res_c0", "v_out_c0 = v_acc_res_c0.to(gl.bfloat16)",
               "def consumer1(", "(pid_m * 128 + 64 + v_res_c1_r)", "v_res_c1_r < M - pid_m * 128 - 64",
               "def producer(",
               f"def {program.name}(a_desc, b_desc, c_desc, bias_ptr, r_ptr, M, N, K):"]
    assert_in_order(src, ordered)
    producer = src[src.index("def producer("):src.index(f"def {program.name}(")]
    assert "r_ptr + " not in producer  # R is the consumers' load, not the producer's
