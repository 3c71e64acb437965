"""The decode work's GEMM inputs are in nn.Linear's layout (what a model's decode runs, and what the swap-AB
configs serve)."""
from __future__ import annotations

from torch_autows.bench import peers_decode, peers_gemm
from torch_autows.bench.cases import DecodeCase


def test_decode_gemm_reads_a_transposed_weight(monkeypatch):
    monkeypatch.setattr(peers_gemm, "DEVICE", "cpu")
    case = DecodeCase(8, 64, 96)
    inp = peers_decode.make_inputs(case)
    a, b = inp["a"], inp["b"]
    assert a.shape == (8, 64) and a.is_contiguous()
    assert b.shape == (64, 96) and b.stride() == (1, 64) and b.t().is_contiguous()  # w [N, K] row-major, read as w.t()
    assert peers_decode.reference(case, inp).out.shape == (8, 96)
