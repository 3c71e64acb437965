"""Every config that serves the RoPE epilogue (runtime.gemm.serves_rope) compiles offline to a sm_90a cubin without
spills, and the rotation is register-only: the kernel's shared-memory instructions and shuffles are the plain GEMM's
(rotate_half's reshape/permute/split/join in wgmma's accumulator layout moves no data between threads,
passes/README.md); the generated epilogue reads the tables at rows m % P and columns n % D, rotates, and rounds
once. A 256-wide tile would spill, which is why those configs refuse it."""
from __future__ import annotations

import itertools

import pytest
from programs import assert_in_order, compile_ws_cubin

from torch_autows.codegen import gluon
from torch_autows.codegen.compile import compile_offline, summary
from torch_autows.passes import pipeline
from torch_autows.runtime.gemm import CONFIGS, serves_rope
from torch_autows.templates.gemm import GemmRequest, build


def _shared_and_shuffles(kernel) -> tuple[int, int, int]:
    ptx = kernel.asm["ptx"]
    return ptx.count("ld.shared"), ptx.count("st.shared"), ptx.count("shfl.sync")


@pytest.mark.parametrize("config,d,bias", [(c, d, b) for c, d, b in itertools.product(CONFIGS, (64, 128), (False, True))
                                           if serves_rope(c, d)])
def test_compiles_without_spills_and_rotates_in_registers(config, d, bias):
    # nn.Linear's layout (x @ w.t()), as the q/k projections run
    program = pipeline.run(build(GemmRequest(4096, 4096, 4096, "bf16", None, False, True, bias, rope=d),
                                 CONFIGS[config]))
    kernel, _ = compile_ws_cubin(program)
    plain = pipeline.run(build(GemmRequest(4096, 4096, 4096, "bf16", None, False, True, bias), CONFIGS[config]))
    assert _shared_and_shuffles(kernel) == _shared_and_shuffles(compile_offline(plain))


def test_a_256_wide_tile_would_spill():
    """Why serves_rope excludes 256-wide tiles (if this starts to pass without spills, widen it)."""
    program = pipeline.run(build(GemmRequest(4096, 4096, 4096, trans_b=True, rope=128), CONFIGS["ws_p_128x256"]))
    assert summary(program, compile_offline(program))["spills"] > 0


def test_generated_epilogue():
    program = pipeline.run(build(GemmRequest(1, 1, 1, trans_b=True, rope=128), CONFIGS["ws_p_128x128"]))
    src = gluon.generate(program)
    assert_in_order(src, [
        "def consumer0(", "v_acc_out_c0_done = warpgroup_mma_wait(num_outstanding=0",
        "v_cos_tile_c0_p = cos_ptr + (((pid_m * 128 + v_cos_tile_c0_r) % (P)).to(gl.int64) * (128))[:, None] + "
        "((0 + v_cos_tile_c0_c) % (128))[None, :]",
        "v_cos_tile_c0 = gl.load(v_cos_tile_c0_p, mask=v_cos_tile_c0_m, other=0.0).to(gl.float32)",
        "v_sin_tile_c0 = gl.load(",
        "v_acc_rot_c0_x1, v_acc_rot_c0_x2 = gl.split(gl.permute(gl.reshape(v_acc_out_c0_done, [64, 2, 64]), "
        "(0, 2, 1)))",
        "v_acc_rot_c0 = gl.convert_layout(gl.reshape(gl.permute(gl.join(-v_acc_rot_c0_x2, v_acc_rot_c0_x1), "
        "(0, 2, 1)), [64, 128]), MMA_N128)",
        "v_acc_cos_c0 = v_acc_out_c0_done * v_cos_tile_c0", "v_acc_sin_c0 = v_acc_rot_c0 * v_sin_tile_c0",
        "v_acc_rope_c0 = v_acc_cos_c0 + v_acc_sin_c0", "v_out_c0 = v_acc_rope_c0.to(gl.bfloat16)",
        "def consumer1(", "((pid_m * 128 + 64 + v_cos_tile_c1_r) % (P))", "def producer("])
    # two heads of 64 in a tile: the four-axis form
    src64 = gluon.generate(pipeline.run(build(GemmRequest(1, 1, 1, trans_b=True, rope=64), CONFIGS["ws_p_128x128"])))
    assert "gl.reshape(v_acc_out_c0_done, [64, 2, 2, 32]), (0, 1, 3, 2))" in src64


@pytest.mark.parametrize("dtype,bias", [("bf16", False), ("bf16", True), ("fp16", False)])
def test_wide_chunked_tile_compiles_without_spills(dtype, bias):
    """runtime.gemm_rope.WIDE: the 128x256 tile with RoPE in half-head chunks (what the 256-wide tile above spills
    without them) keeps the large-GEMM pick's 64-deep ring of 3 stages beside the tables' tiles, within SMEM."""
    from torch_autows.runtime.gemm_rope import WIDE

    opts = WIDE["rope_p_128x256"]
    program = pipeline.run(build(GemmRequest(4096, 4096, 4096, dtype, None, False, True, bias, rope=128), opts))
    kernel, _ = compile_ws_cubin(program)
    s = summary(program, kernel)
    assert s["spills"] == 0 and s["smem_bytes"] <= 232448, s
    assert "barriers g0: 3 slots of 49152 B" in gluon.generate(program)
