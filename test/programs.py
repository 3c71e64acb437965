"""Small Programs shared by the IR, pass and interpreter tests."""
from __future__ import annotations

from torch_autows.ir import Options
from torch_autows.templates.gemm import GemmRequest, build

SMALL = Options(block_m=128, block_n=64, block_k=32, stages=3, data_partition=2, persistent=True)


def small_gemm(**kw):
    opts = kw.pop("options", SMALL)
    return build(GemmRequest(256, 128, 96, **kw), opts)
