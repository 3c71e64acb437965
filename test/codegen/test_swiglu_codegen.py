"""Every swiglu config (runtime.swiglu) compiles offline to a sm_90a cubin: no spills with two accumulators per
consumer warpgroup, SMEM within the limit, the WS structure, and the fused epilogue in the source."""
from __future__ import annotations

import itertools

import pytest
from programs import assert_in_order, compile_ws_cubin

from torch_autows.codegen import gluon
from torch_autows.passes import pipeline
from torch_autows.runtime.swiglu import CONFIGS
from torch_autows.templates.gemm import GemmRequest, build

VARIANTS = {  # (trans_a, trans_b, dtype, out_dtype)
    "nn": (False, False, "bf16", None),
    "nt_fp16_f32out": (False, True, "fp16", "f32"),  # nn.Linear weights (w.t() views), fp32 output
}


# a swap-AB config serves nn.Linear's layout only (templates.gemm.swap_reason)
@pytest.mark.parametrize("config,variant", [(c, v) for c, v in itertools.product(CONFIGS, VARIANTS)
                                            if not CONFIGS[c].swap_ab or VARIANTS[v][:2] == (False, True)])
def test_compiles_without_spills(config, variant):
    ta, tb, dt, odt = VARIANTS[variant]
    program = pipeline.run(build(GemmRequest(4096, 14336, 4096, dt, odt, ta, tb, epilogue="swiglu"), CONFIGS[config]))
    kernel, s = compile_ws_cubin(program)
    assert kernel.asm["cubin"][:4] == b"\x7fELF"
    # each consumer warpgroup holds two accumulators of 64 rows (swap-AB: of block_n rows and block_m columns):
    # their registers fit its budget with room left
    o = program.options
    acc_regs = 2 * o.block_n * o.block_m // 128 if o.swap_ab else 2 * 64 * o.block_n // 128
    for p in s["partitions"][:-1]:
        assert acc_regs <= p["regs"] - 64, (config, p)
    if o.swap_ab:  # the weights' tiles in wgmma's A slot, the activations' rows its N; C by pointer stores
        ptx = kernel.asm["ptx"]
        assert f"wgmma.mma_async.sync.aligned.m64n{o.block_m}k16" in ptx and "st.global" in ptx


def test_generated_source_has_two_mmas_and_the_fused_epilogue():
    program = pipeline.run(build(GemmRequest(1, 1, 1, epilogue="swiglu"), CONFIGS["swiglu_p_128x128"]))
    src = gluon.generate(program)
    ordered = ["def consumer0(", "mbarrier.wait(g0_ready.index(g0_s)",
               "v_acc_next_c0 = warpgroup_mma(v_a_c0, v_b, v_acc_c0, is_async=True)",
               "warpgroup_mma_wait(num_outstanding=1",
               "v_acc_u_next_c0 = warpgroup_mma(v_a_c0, v_bu, v_acc_u_c0, is_async=True)",
               "warpgroup_mma_wait(num_outstanding=1", "mbarrier.arrive(g0_empty.index(",
               "v_acc_out_c0_done = warpgroup_mma_wait(num_outstanding=0",
               "v_acc_u_out_c0_done = warpgroup_mma_wait(num_outstanding=0",
               "v_gate_c0 = v_acc_out_c0_done / (1.0 + gl.exp2(v_acc_out_c0_done * -1.4426950408889634))",
               "v_act_c0 = v_gate_c0 * v_acc_u_out_c0_done", "v_out_c0 = v_act_c0.to(gl.bfloat16)",
               "tma.async_copy_shared_to_global(c_desc, [pid_m * 128, pid_n * 128], out_c0_stage)",
               "def producer(", "mbarrier.expect(g0_ready.index(g0_s), 49152)",
               "tma.async_copy_global_to_shared(bu_desc, [k * 64, pid_n * 128]",
               f"def {program.name}(a_desc, b_desc, bu_desc, c_desc, M, N, K):"]
    assert_in_order(src, ordered)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_saving_config_compiles_without_spills(variant):
    """The training site's kernel (runtime.swiglu.SAVE_CONFIG, epilogue "swiglu_save"): three stores, no spills,
    SMEM within the limit."""
    from torch_autows.runtime.swiglu import SAVE_CONFIG

    ta, tb, dt, odt = VARIANTS[variant]
    program = pipeline.run(build(GemmRequest(16384, 14336, 4096, dt, odt, ta, tb, epilogue="swiglu_save"),
                                 CONFIGS[SAVE_CONFIG]))
    kernel, s = compile_ws_cubin(program)
    src = gluon.generate(program)
    for desc in ("g_desc", "u_desc", "c_desc"):
        assert f"tma.async_copy_shared_to_global({desc}, [pid_m * 128, pid_n * 128]" in src
