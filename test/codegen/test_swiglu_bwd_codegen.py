"""Every SwiGLU backward config (runtime.swiglu_bwd) compiles offline to a sm_90a cubin without spills, SMEM within
the limit, in both weight layouts and both 16-bit dtypes; the generated epilogue computes one sigmoid for both
gradients, stores du from G's slot before it reads U, and dG from U's slot."""
from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
from programs import assert_in_order, compile_ws_cubin

from torch_autows.codegen import gluon
from torch_autows.codegen.compile import compile_offline, summary
from torch_autows.passes import pipeline
from torch_autows.runtime.swiglu_bwd import CONFIGS
from torch_autows.templates.gemm import GemmRequest, build

WHOLE = "swiglu_bwd_p_128x128"  # the epilogue on whole tiles (the 128x256 config's in chunks)

VARIANTS = {  # (trans_b, dtype): W_down used as is (nn, the training graph's), or as a transposed view
    "nn": (False, "bf16"),
    "nt_fp16": (True, "fp16"),
}


@pytest.mark.parametrize("config,variant", list(itertools.product(CONFIGS, VARIANTS)))
def test_compiles_without_spills(config, variant):
    tb, dt = VARIANTS[variant]
    program = pipeline.run(build(GemmRequest(16384, 14336, 4096, dt, None, False, tb, epilogue="swiglu_bwd"),
                                 CONFIGS[config]))
    compile_ws_cubin(program)


def test_pointer_loads_of_g_and_u_would_spill():
    """Why the config takes G and U by TMA (if this starts to pass without spills, the pointer form is an option
    again: it needs 32 KB less SMEM)."""
    program = pipeline.run(build(GemmRequest(1, 1, 1, epilogue="swiglu_bwd"), replace(CONFIGS[WHOLE],
                                                                                      epilogue_tma=False)))
    assert summary(program, compile_offline(program))["spills"] > 0


def test_generated_epilogue():
    program = pipeline.run(build(GemmRequest(1, 1, 1, epilogue="swiglu_bwd"), CONFIGS[WHOLE]))
    src = gluon.generate(program)
    assert src.count("gl.exp2(") == 2  # one sigmoid per consumer
    assert_in_order(src, [
        "def consumer0(", "v_acc_out_c0_done = warpgroup_mma_wait(num_outstanding=0",
        "v_g_tile_m_c0 = v_g_tile_s_c0.load(MMA_N128)",
        "v_sig_g_c0 = 1.0 / (1.0 + gl.exp2(v_g_tile_c0 * -1.4426950408889634))",
        "v_silu_g_c0 = v_g_tile_c0 * v_sig_g_c0", "v_d_up_c0 = v_acc_out_c0_done * v_silu_g_c0",
        "v_dsilu_g_c0 = v_sig_g_c0 * (1.0 + v_g_tile_c0 * (1.0 - v_sig_g_c0))",
        "v_d_act_c0 = v_acc_out_c0_done * v_dsilu_g_c0", "v_g_tile_s_c0.store(v_du_out_c0)",
        "tma.async_copy_shared_to_global(du_desc, [pid_m * 128, pid_n * 128], v_g_tile_s_c0)",
        "v_u_tile_m_c0 = v_u_tile_s_c0.load(MMA_N128)", "v_d_gate_c0 = v_d_act_c0 * v_u_tile_c0",
        "v_u_tile_s_c0.store(v_out_c0)",
        "tma.async_copy_shared_to_global(c_desc, [pid_m * 128, pid_n * 128], v_u_tile_s_c0)",
        "mbarrier.arrive(g1_empty.index(g1_s))", "def producer(",
        "tma.async_copy_global_to_shared(g_desc, [pid_m * 128, pid_n * 128], g1_ready.index(g1_s), "
        "g_tile_s_c0_smem.index(g1_s))",
        f"def {program.name}(a_desc, b_desc, c_desc, du_desc, g_desc, u_desc, M, N, K):"])


def test_chunked_epilogue_splits_the_accumulator_in_registers_and_waits_once():
    """The 128x256 config's epilogue: the accumulator cut into four 64-column chunks by reshape/permute/split (no
    shared-memory round trip), each chunk's G read through a slice of its slot, du stored from that slice at the
    chunk's columns, and one store_wait before the slots' release."""
    program = pipeline.run(build(GemmRequest(1, 1, 1, epilogue="swiglu_bwd"), CONFIGS["swiglu_bwd_p_128x256"]))
    src = gluon.generate(program)
    consumer = src[src.index("def consumer0("):src.index("def consumer1(")]
    assert consumer.count("gl.split(gl.permute(gl.reshape(") == 3 and "gl.convert_layout(" in consumer
    assert consumer.count("tma.async_copy_shared_to_global(") == 8 and consumer.count("tma.store_wait(0)") == 2
    assert_in_order(consumer, [
        "v_acc_out_k0_c0 = gl.convert_layout(v_acc_out_c0_done_h64_0, MMA_N64)",
        "v_g_s_k0_c0 = v_g_tile_s_c0.slice(0, 64, 1)", "v_g_m_k0_c0 = v_g_s_k0_c0.load(MMA_N64)",
        "v_g_s_k0_c0.store(v_du_out_k0_c0)",
        "tma.async_copy_shared_to_global(du_desc, [pid_m * 128, pid_n * 256], v_g_s_k0_c0)",
        "v_u_s_k3_c0.store(v_out_k3_c0)",
        "tma.async_copy_shared_to_global(c_desc, [pid_m * 128, pid_n * 256 + 192], v_u_s_k3_c0)",
        "tma.store_wait(0)", "mbarrier.arrive(g1_empty.index(g1_s))"])


def test_ping_pong_chunked_form_compiles_without_spills():
    """The sweep's candidate (sweeps/swiglu_bwd_wide.py ``fused_pp_128x128``): two consumers taking turns over whole
    128x128 tiles, the epilogue in 32-column chunks, compiles without spills (64-column chunks spill there)."""
    o = replace(CONFIGS["swiglu_bwd_p_128x256"], block_n=128, block_k=64, stages=3, data_partition=1,
                tile_consumers=2, epilogue_chunk=32)
    compile_ws_cubin(pipeline.run(build(GemmRequest(16384, 14336, 4096, epilogue="swiglu_bwd"), o)))


@pytest.mark.parametrize("prefetch_of", ["swiglu_bwd_p_128x256", "ping_pong"])
def test_prefetched_forms_compile_without_spills(prefetch_of):
    """The sweep's ``epilogue_prefetch`` candidates (G and U loaded at the tile's start) compile without spills."""
    o = CONFIGS["swiglu_bwd_p_128x256"]
    if prefetch_of == "ping_pong":
        o = replace(o, block_n=128, block_k=64, stages=3, data_partition=1, tile_consumers=2, epilogue_chunk=32,
                    tile_buffers=2)  # two copies of G and U: the consumers' turns do not wait on one slot
    compile_ws_cubin(pipeline.run(build(GemmRequest(16384, 14336, 4096, epilogue="swiglu_bwd"),
                                        replace(o, epilogue_prefetch=True))))
