"""RoPE sites in post-grad graphs (inductor/rope_sites.py): the q/k projections followed by rotary embedding in the
Llama example and in Hugging Face's form (rotate_half by slicing, [B, 1, S, D] position embeddings of the model's
dtype) are found with the GEMM, the head dim and the tables; near misses carry their reason; other graphs have none."""
from __future__ import annotations

import pytest
import torch
import torch._inductor.config as ic
import torch.nn as nn

from torch_autows.bench.llama import LlamaConfig, apply_rope, build_model
from torch_autows.inductor import api, graph_passes
from torch_autows.inductor.rope_sites import find_rope_sites

aten = torch.ops.aten


def _sites(model, *xs, monkeypatch, grad=False):
    """The RoPE sites of each post-grad graph of ``torch.compile(model)(*xs)``, found before autows's rewrites."""
    found = []
    real = graph_passes.AutoWSPostGradPass.ours

    def ours(self, graph):
        found.append(find_rope_sites(graph))
        real(self, graph)

    monkeypatch.setattr(graph_passes.AutoWSPostGradPass, "ours", ours)
    with ic.patch(api.inductor_options()), torch.set_grad_enabled(grad):
        out = torch.compile(model)(*xs)
        if grad:
            out.float().sum().backward()
    return found


def test_llama_example_q_and_k(monkeypatch):
    cfg = LlamaConfig(n_layers=1, hidden=256, n_heads=4, n_kv_heads=2, head_dim=64, ffn=512, max_seq_len=64)
    model = build_model(cfg, device="cpu")
    (sites,) = _sites(model, torch.randn(2, 16, 256, dtype=torch.bfloat16), monkeypatch=monkeypatch)
    assert len(sites) == 2 and all(s.reason is None for s in sites), [s.reason for s in sites]
    assert [tuple(s.gemm.meta["val"].shape) for s in sites] == [(32, 256), (32, 128)]  # q (4 heads), k (2)
    for s in sites:
        assert s.head_dim == 64 and s.gemm.target is aten.mm.default and s.permute.args[1] == [0, 2, 1, 3]
        assert [tuple(t.meta["val"].shape) for t in (s.cos, s.sin)] == [(16, 64), (16, 64)]  # rope_cos[:S], fp32
        assert s.cos.meta["val"].dtype == torch.float32 and s.cos is not s.sin


class HFAttention(nn.Module):
    """Hugging Face Llama's q/k path: rotate_half by slicing, position embeddings [B, S, D] unsqueezed to
    [B, 1, S, D], already of the model's dtype."""

    def __init__(self, hidden=128, heads=2, d=64, per_head_tables=False):
        super().__init__()
        self.q, self.k, self.heads, self.d = nn.Linear(hidden, heads * d, bias=False), nn.Linear(hidden, d), heads, d
        self.per_head_tables = per_head_tables

    @staticmethod
    def rotate_half(x):
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
        return torch.cat((-x2, x1), dim=-1)

    def forward(self, x, cos, sin):
        B, S, _ = x.shape
        q = self.q(x).view(B, S, -1, self.d).transpose(1, 2)
        k = self.k(x).view(B, S, -1, self.d).transpose(1, 2)
        if self.per_head_tables:  # one table per head: not a RoPE the epilogue's [S, D] rows serve
            cos, sin = cos.unsqueeze(1).expand(B, self.heads, S, self.d), sin.unsqueeze(1).expand(B, self.heads, S,
                                                                                                 self.d)
        else:
            cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        q = q * cos + self.rotate_half(q) * sin
        return q, k * cos[:, :, :, :] + self.rotate_half(k) * sin


def _hf_inputs(B=2, S=8, hidden=128, d=64):
    x = torch.randn(B, S, hidden, dtype=torch.bfloat16)
    ang = torch.randn(B, S, d // 2).repeat(1, 1, 2)
    return x, ang.cos().to(torch.bfloat16), ang.sin().to(torch.bfloat16)


def test_hugging_face_form(monkeypatch):
    model = HFAttention().to(torch.bfloat16)
    (sites,) = _sites(model, *_hf_inputs(), monkeypatch=monkeypatch)
    assert len(sites) == 2 and all(s.reason is None for s in sites), [s.reason for s in sites]
    assert {s.gemm.target for s in sites} == {aten.mm.default, aten.addmm.default}  # k has a bias
    assert all(tuple(s.cos.meta["val"].shape) == (2, 1, 8, 64) for s in sites)


def test_near_misses_carry_their_reason(monkeypatch):
    model = HFAttention(per_head_tables=True).to(torch.bfloat16)
    (sites,) = _sites(model, *_hf_inputs(), monkeypatch=monkeypatch)
    assert sites and all("does not broadcast as [S, D] or [B, 1, S, D]" in s.reason for s in sites)

    class Keeps(nn.Module):  # the rotated input is also returned: the projection's output must be kept
        def __init__(self):
            super().__init__()
            self.q = nn.Linear(128, 128, bias=False)

        def forward(self, x, cos, sin):
            q = self.q(x).view(2, 8, 2, 64).transpose(1, 2)
            return apply_rope(q, cos, sin), q * 2

    (sites,) = _sites(Keeps().to(torch.bfloat16), *_hf_inputs()[:1], *(t[0] for t in _hf_inputs()[1:]),
                      monkeypatch=monkeypatch)
    assert len(sites) == 1 and "also used outside the pattern" in sites[0].reason


@pytest.mark.parametrize("swap", [False, True])
def test_other_rotations_are_not_sites(monkeypatch, swap):
    """cat(x2, -x1) (the inverse rotation) or rotation on the sequence axis: not RoPE as the models write it."""

    class Other(nn.Module):
        def __init__(self):
            super().__init__()
            self.q = nn.Linear(128, 128, bias=False)

        def forward(self, x, cos, sin):
            q = self.q(x).view(2, 8, 2, 64).transpose(1, 2)
            x1, x2 = q.chunk(2, dim=-2 if swap else -1)
            rot = torch.cat((-x2, x1), dim=-2) if swap else torch.cat((x2, -x1), dim=-1)
            return q * cos + rot * sin

    x, cos, sin = _hf_inputs()
    assert _sites(Other().to(torch.bfloat16), x, cos[0], sin[0], monkeypatch=monkeypatch) == [[]]
