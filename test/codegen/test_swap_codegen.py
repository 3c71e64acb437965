"""Every swap-AB decode config (``Options.swap_ab``, runtime.gemm_configs ``decs_*``) compiles offline to a sm_90a
cubin, warp-specialized, without spills, for nn.Linear's layout with a bias (bf16) and with fp32 output (fp16): the
[BN, BM] accumulator, split-K's reduction of it and the masked transposed pointer store fit the consumer's registers.
(test_codegen.py compiles the nt fp16 variant without a bias too.)"""
from __future__ import annotations

import pytest
from programs import compile_ws_cubin

from torch_autows.passes import pipeline
from torch_autows.runtime.gemm import CONFIGS
from torch_autows.templates.gemm import GemmRequest, build

SWAP = [c for c, o in CONFIGS.items() if o.swap_ab]


@pytest.mark.parametrize("dtype,out_dtype", [("bf16", None), ("fp16", "f32")])
@pytest.mark.parametrize("config", SWAP)
def test_compiles_without_spills(config, dtype, out_dtype):
    program = pipeline.run(build(GemmRequest(1, 1, 1, dtype, out_dtype, trans_b=True, bias=True), CONFIGS[config]))
    kernel, s = compile_ws_cubin(program)
    o = CONFIGS[config]
    # the weight tile is wgmma's A (block_n rows: one or two m64 blocks), the activations' rows its N
    assert f"wgmma.mma_async.sync.aligned.m64n{o.block_m}k16" in kernel.asm["ptx"]
    ptx = kernel.asm["ptx"]
    assert "cp.async.bulk.tensor.2d.global.shared" not in ptx and "st.global" in ptx  # C by pointer stores, not TMA
