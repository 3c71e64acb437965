"""The post-grad RoPE rewrite (inductor/rewrite_rope.py): the q/k projections followed by rotary embedding become one
``autows::gemm_rope`` each (then the reshape and permute) in the Llama example and in Hugging Face's form, inference
and training forward graphs alike, with the outputs and gradients of the unfused model; near misses and sites
without static sizes stay with a logged reason; the op's checks, fake and torch fallback; explain() lists the
fusion per site."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from torch_autows.bench.llama import LlamaConfig, apply_rope, build_model, rope_tables
from torch_autows.inductor import support

from .conftest import compile_post_grad as _run
from .test_rope_sites import HFAttention, _hf_inputs

SMALL = LlamaConfig(n_layers=1, hidden=256, n_heads=4, n_kv_heads=2, head_dim=64, ffn=512, max_seq_len=64)


def _assert_q_and_k_fused(model, *inputs, monkeypatch):
    """Compiled, a model returning (q, k) runs one autows::gemm_rope per site, with the eager model's outputs."""
    with torch.no_grad():
        (q, k), graph = _run(model, *inputs, monkeypatch=monkeypatch)
        rq, rk = model(*inputs)
    assert graph.count("autows.gemm_rope") == 2, graph
    torch.testing.assert_close(q, rq, atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(k, rk, atol=3e-2, rtol=3e-2)


def test_llama_example_q_and_k_are_fused(pretend, monkeypatch):
    torch._dynamo.reset()
    support.reset()
    model = build_model(SMALL, device="cpu")
    x = torch.randn(2, 16, 256, dtype=torch.bfloat16)
    with torch.no_grad():
        got, graph = _run(model, x, monkeypatch=monkeypatch)
        ref = model(x)
    assert support.site_counters["gemm_rope.rewritten"] == 2, graph
    assert graph.count("autows.gemm_rope") == 2 and "aten.cat" not in graph and "aten.neg" not in graph
    torch.testing.assert_close(got, ref, atol=3e-2, rtol=3e-2)


def test_hugging_face_form_with_a_bias_and_per_row_tables(pretend, monkeypatch):
    torch._dynamo.reset()
    support.reset()
    # [B, S, D] tables, unsqueezed to [B, 1, S, D]: a table row per output row
    _assert_q_and_k_fused(HFAttention().to(torch.bfloat16), *_hf_inputs(), monkeypatch=monkeypatch)


def test_training_forward_is_fused_and_gradients_match(pretend, monkeypatch):
    torch._dynamo.reset()
    support.reset()
    model = HFAttention().to(torch.bfloat16)
    x, cos, sin = _hf_inputs()
    x.requires_grad_()
    (q, k), graph = _run(model, x, cos, sin, monkeypatch=monkeypatch)
    (q.float().sum() + k.float().pow(2).sum()).backward()
    assert "autows.gemm_rope" in graph  # nothing of the pattern is saved for the backward
    xr = x.detach().clone().requires_grad_()
    rq, rk = model(xr, cos, sin)
    (rq.float().sum() + rk.float().pow(2).sum()).backward()
    torch.testing.assert_close(x.grad, xr.grad, atol=5e-2, rtol=5e-2)
    for p in model.parameters():
        assert p.grad is not None


class SharedCast(nn.Module):
    """The tables cast once and read by both sites (a layer's q and k)."""

    def __init__(self):
        super().__init__()
        self.q, self.k = nn.Linear(128, 128, bias=False), nn.Linear(128, 64, bias=False)

    def forward(self, x, cos, sin):
        B, S, _ = x.shape
        c, s = cos.to(x.dtype), sin.to(x.dtype)
        q = self.q(x).view(B, S, 2, 64).transpose(1, 2)
        k = self.k(x).view(B, S, 1, 64).transpose(1, 2)
        return apply_rope(q, c, s), apply_rope(k, c, s)


def test_tables_cast_once_for_both_sites(pretend, monkeypatch):
    torch._dynamo.reset()
    support.reset()
    cos, sin = rope_tables(LlamaConfig(head_dim=64), 8)  # fp32, as the Llama example keeps them
    _assert_q_and_k_fused(SharedCast().to(torch.bfloat16), torch.randn(2, 8, 128, dtype=torch.bfloat16), cos, sin,
                          monkeypatch=monkeypatch)


def test_near_misses_and_symbolic_sizes_stay_with_a_reason(pretend, monkeypatch, log_warnings):
    torch._dynamo.reset()
    support.reset()
    model = HFAttention(per_head_tables=True).to(torch.bfloat16)
    with torch.no_grad():
        _, graph = _run(model, *_hf_inputs(), monkeypatch=monkeypatch)
    assert "autows.gemm_rope" not in graph and "does not broadcast" in log_warnings.text
    import torch_autows

    torch._dynamo.reset()
    support.reset()
    with torch.no_grad(), torch_autows.config.patch(choice="measure"):  # (tests force "autows": conftest.py)
        _, graph = _run(build_model(SMALL, device="cpu"), torch.randn(2, 16, 256, dtype=torch.bfloat16),
                        monkeypatch=monkeypatch, dynamic=True)
    assert "autows.gemm_rope" not in graph and "needs static sizes" in log_warnings.text
    torch._dynamo.reset()
    support.reset()
    with torch.no_grad(), torch_autows.config.patch(choice="measure"):  # static, but no sm_90 GPU to measure on
        _, graph = _run(build_model(SMALL, device="cpu"), torch.randn(4, 40, 256, dtype=torch.bfloat16),
                        monkeypatch=monkeypatch)
    assert "autows.gemm_rope" not in graph and "not measured at compile time" in log_warnings.text
    torch._dynamo.reset()
    support.reset()
    with torch.no_grad(), torch_autows.config.patch(choice="measure"):  # 32 rows: host time would show
        _, graph = _run(build_model(SMALL, device="cpu"), torch.randn(2, 16, 256, dtype=torch.bfloat16),
                        monkeypatch=monkeypatch)
    assert "autows.gemm_rope" not in graph and "no replay fast path yet" in log_warnings.text


def test_op_checks_fake_and_fallback(log_warnings):
    import torch_autows.custom_ops  # noqa: F401  (registers autows::gemm_rope)
    from torch_autows.runtime import fallback

    fallback.reset()

    bf = torch.bfloat16
    B, S, H, D, K = 2, 8, 3, 64, 32
    a, w = torch.randn(B * S, K, dtype=bf), torch.randn(H * D, K, dtype=bf)
    cos, sin = (t.to(bf) for t in rope_tables(LlamaConfig(head_dim=D), S))
    bias = torch.randn(H * D, dtype=bf)
    got = torch.ops.autows.gemm_rope(a, w.t(), cos, sin, bias)  # CPU: torch computes it, in fp32, rounded once
    assert fallback.counters["gemm_rope.fallback"] == 1
    assert "autows gemm_rope: falling back to torch: tensors on cpu" in log_warnings.text  # the runtime's reason
    y = (a.float() @ w.float().t() + bias.float()).view(B, S, H, D).transpose(1, 2)
    want = apply_rope(y, cos.float(), sin.float()).transpose(1, 2).reshape(B * S, H * D)
    assert torch.equal(got, want.to(bf))
    with torch._subclasses.fake_tensor.FakeTensorMode():
        fa, fb, fc = torch.empty(16, 32, dtype=bf), torch.empty(32, 192, dtype=bf), torch.empty(8, 64, dtype=bf)
        assert torch.ops.autows.gemm_rope(fa, fb, fc, fc).shape == (16, 192)
        with pytest.raises(ValueError, match="need an even D dividing N"):
            torch.ops.autows.gemm_rope(fa, fb, torch.empty(8, 60, dtype=bf), torch.empty(8, 60, dtype=bf))
    with pytest.raises(ValueError, match="both must be \\[P, D\\]"):
        torch.ops.autows.gemm_rope(a, w.t(), cos, sin[:4])


class _Plain(nn.Module):
    """A projection without RoPE: no site."""

    def __init__(self):
        super().__init__()
        self.q = nn.Linear(64, 64, bias=False)

    def forward(self, x):
        return self.q(x).view(2, 4, 1, 64).transpose(1, 2) * 2


def test_no_site_no_rewrite(pretend, monkeypatch):
    torch._dynamo.reset()
    support.reset()
    with torch.no_grad():
        _, graph = _run(_Plain().to(torch.bfloat16), torch.randn(2, 4, 64, dtype=torch.bfloat16),
                        monkeypatch=monkeypatch)
    assert "gemm_rope" not in graph and support.site_counters["gemm_rope.rewritten"] == 0


def test_explain_lists_the_fusion(pretend):
    import torch_autows

    torch._dynamo.reset()
    report = torch_autows.explain(build_model(SMALL, device="cpu"), torch.randn(2, 16, 256, dtype=torch.bfloat16),
                                  print_report=False)
    rope = [s for s in report.sites if "+rope(64)" in s.shape]
    assert len(rope) == 2 and all(s.kernel == "autows" and "autows::gemm_rope" in s.why for s in rope), report
    assert [s.shape for s in rope] == ["[32x256]@[256x256]+rope(64)", "[32x256]@[256x128]+rope(64)"]  # q, k
    torch._dynamo.reset()
    report = torch_autows.explain(HFAttention(per_head_tables=True).to(torch.bfloat16), *_hf_inputs(),
                                  print_report=False)
    assert not any("+rope" in s.shape for s in report.sites)
    assert any("RoPE not fused: table" in s.why and "does not broadcast" in s.why for s in report.sites), report
