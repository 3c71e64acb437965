"""Every config that serves the residual epilogue (runtime.gemm.serves_residual), built as runtime.gemm builds it
(``residual_options``: R's tile by TMA where K is not split, by pointers after split-K's reduction), compiles offline
to a sm_90a cubin without spills, and the generated epilogue adds R in fp32 after the bias and before the cast, R
read from the producer's SMEM tile (TMA) or straight into registers (pointers); pointer loads on a 256-wide tile
would spill, which is why the split-K 256-wide configs refuse a residual."""
from __future__ import annotations

import itertools

import pytest
from programs import assert_in_order, compile_ws_cubin

from torch_autows.codegen import gluon
from torch_autows.codegen.compile import compile_offline, summary
from torch_autows.passes import pipeline
from torch_autows.runtime.gemm import CONFIGS, residual_options, serves_residual
from torch_autows.templates.gemm import GemmRequest, build

VARIANTS = {  # (trans_a, trans_b, bias, dtype, out_dtype)
    "nt_bias": (False, True, True, "bf16", None),  # nn.Linear weights (w.t() views) with a bias
    "tn_fp16_f32out": (True, False, False, "fp16", "f32"),
}


@pytest.mark.parametrize("config,variant", [(c, v) for c, v in itertools.product(CONFIGS, VARIANTS)
                                            if serves_residual(c, out32=VARIANTS[v][4] == "f32")])
def test_compiles_without_spills(config, variant):
    ta, tb, bias, dt, odt = VARIANTS[variant]
    program = pipeline.run(build(GemmRequest(4096, 4096, 4096, dt, odt, ta, tb, bias, residual=True),
                                 residual_options(config)))
    compile_ws_cubin(program)


def test_pointer_loads_on_a_256_wide_tile_would_spill():
    """Why serves_residual excludes 256-wide split-K tiles, which load R by pointers (if this starts to pass without
    spills, widen it)."""
    program = pipeline.run(build(GemmRequest(4096, 4096, 4096, residual=True), CONFIGS["ws_np_128x256"]))
    assert summary(program, compile_offline(program))["spills"] > 0


def test_generated_epilogue():
    """R by pointers (split-K: the CTA that stores adds it after the reduction)."""
    program = pipeline.run(build(GemmRequest(1, 1, 1, bias=True, residual=True), residual_options("dec_128x128_s2")))
    src = gluon.generate(program)
    ordered = ["def consumer0(", "v_acc_bias = v_acc_out_sum + v_bias_row",
               "v_res_r = gl.arange(0, 64, layout=MMA_N128_S1)",
               "v_res_p = r_ptr + ((pid_m * 64 + v_res_r).to(gl.int64) * (N))[:, None] + "
               "(pid_n * 128 + v_res_c)[None, :]",
               "v_res_m = (v_res_r < M - pid_m * 64)[:, None] & (v_res_c < N - pid_n * 128)[None, :]",
               "v_res = gl.load(v_res_p, mask=v_res_m, other=0.0).to(gl.float32)",
               "v_acc_res = v_acc_bias + v_res", "v_out = v_acc_res.to(gl.bfloat16)", "def producer(",
               f"def {program.name}(a_desc, b_desc, c_desc, bias_ptr, r_ptr, M, N, K, ws_ptr, locks_ptr):"]
    assert_in_order(src, ordered)
    producer = src[src.index("def producer("):src.index(f"def {program.name}(")]
    assert "r_ptr + " not in producer  # R is the consumer's load, not the producer's


def test_generated_epilogue_by_tma():
    """R by TMA: the producer loads each chain's tile after the tile's K steps, the consumer reads it from SMEM after
    its last mma and stores the sum from the same slot."""
    program = pipeline.run(build(GemmRequest(1, 1, 1, bias=True, residual=True), residual_options("ws_p_128x256")))
    src = gluon.generate(program)
    assert_in_order(src, [
        "def consumer0(", "v_acc_out_c0_done = warpgroup_mma_wait(num_outstanding=0",
        "v_acc_bias_c0 = v_acc_out_c0_done + v_bias_row_c0", "mbarrier.wait(g1_ready.index(g1_s)",
        "v_res_s_c0 = res_s_c0_smem.index(g1_s)", "v_res_m_c0 = v_res_s_c0.load(MMA_N256)",
        "v_res_c0 = v_res_m_c0.to(gl.float32)", "v_acc_res_c0 = v_acc_bias_c0 + v_res_c0",
        "v_out_c0 = v_acc_res_c0.to(gl.bfloat16)", "v_res_s_c0.store(v_out_c0)",
        "tma.async_copy_shared_to_global(c_desc, [pid_m * 128, pid_n * 256], v_res_s_c0)",
        "mbarrier.arrive(g1_empty.index(g1_s))", "def producer(", "for k in range(0, gl.cdiv(K, 64)):",
        "tma.async_copy_global_to_shared(r_desc, [pid_m * 128, pid_n * 256], g1_ready.index(g1_s), "
        "res_s_c0_smem.index(g1_s))",
        "tma.async_copy_global_to_shared(r_desc, [pid_m * 128 + 64, pid_n * 256], g1_ready.index(g1_s), "
        "res_s_c1_smem.index(g1_s))",
        f"def {program.name}(a_desc, b_desc, c_desc, bias_ptr, r_desc, M, N, K):"])
