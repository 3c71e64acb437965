"""The Triton 3.6 auto-WS peers compile offline for sm_90 and really are warp-specialized.

Triton's Hopper WS pass drops WS silently (wrong num_warps, host descriptors, flatten, ...) or fails the
compile (pointer loads, some causal loops). These tests pin what the peers get, so a Triton change that
drops WS shows up here rather than as a mysteriously slow benchmark row.
"""
from __future__ import annotations

import re

import pytest

from torch_autows.bench import peers_triton as pt

WS = "ttg.warp_specialize"


def _describe(kernel) -> str:
    ttgir = kernel.asm["ttgir"]
    return (f"num_warps={kernel.metadata.num_warps} shared={kernel.metadata.shared} "
            f"ws={WS in ttgir} loops_with_ws_attr={ttgir.count('tt.warp_specialize')}")


def _assert_ws(kernel):
    ttgir = kernel.asm["ttgir"]
    assert WS in ttgir, f"Triton dropped warp specialization: {_describe(kernel)}"
    # 1 producer (the kernel's 4 warps) + 2 consumer warp groups of 4: the Hopper pass's usual split
    assert kernel.metadata.num_warps == 12, _describe(kernel)
    assert re.search(r"requestedRegisters = array<i32: \d+, \d+>", ttgir), _describe(kernel)
    assert kernel.metadata.shared <= pt.SMEM_LIMIT, f"SMEM over 227 KB: {_describe(kernel)}"
    ptx = kernel.asm["ptx"]
    assert "wgmma.mma_async" in ptx and "st.local" not in ptx  # tensor cores, no register spills
    assert pt.ws_note(kernel) is None


@pytest.mark.parametrize("dtype,has_bias", [("bf16", False), ("bf16", True), ("fp16", False)])
def test_gemm_is_warp_specialized(dtype, has_bias):
    _assert_ws(pt.compile_offline_matmul(dtype, has_bias))


@pytest.mark.parametrize("head_dim,causal", [(64, False), (128, False), (64, True), (128, True)])
def test_attention_is_warp_specialized(head_dim, causal):
    # causal uses one loop up to the diagonal with a select mask; Triton 3.6 keeps WS on it
    _assert_ws(pt.compile_offline_attention(head_dim, causal))


def test_ws_note_reports_dropped_ws_at_8_warps():
    """Documents a silent drop: with num_warps=8 the Hopper pass skips WS and the compile still succeeds."""
    kernel = pt.compile_offline_matmul(num_warps=8)
    assert WS not in kernel.asm["ttgir"]
    assert pt.ws_note(kernel) == "ttg.warp_specialize absent from ttgir: Triton dropped WS"


def test_ws_note_reports_smem_over_limit():
    class Fake:
        asm = {"ttgir": WS}

        class metadata:  # noqa: N801
            shared = pt.SMEM_LIMIT + 1

    assert "SMEM" in pt.ws_note(Fake())
    assert pt.ws_note(None) == "no compiled kernel handle to inspect"
