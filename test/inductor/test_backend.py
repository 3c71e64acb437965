"""End-to-end ``torch.compile(backend="autows")`` on CPU: training, fallback logging, dynamic shapes, modes."""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from torch_autows.inductor import backend, graph_passes, support
from torch_autows.runtime import fallback


class Block(nn.Module):
    """SDPA (causal, GQA) and an explicit softmax attention, with linear projections around them."""

    def __init__(self, dim=32, heads=4, kv_heads=2):
        super().__init__()
        self.h, self.kvh, self.d = heads, kv_heads, dim // heads
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * kv_heads * self.d)
        self.o = nn.Linear(dim, dim)

    def forward(self, x):
        B, S, _ = x.shape
        q = self.q(x).view(B, S, self.h, self.d).transpose(1, 2)
        k, v = self.kv(x).view(B, S, 2, self.kvh, self.d).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        k2, v2 = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
        w = torch.softmax(q @ k2.transpose(-2, -1) / math.sqrt(self.d), dim=-1)
        y = (a + w @ v2).transpose(1, 2).reshape(B, S, -1)
        return F.gelu(self.o(y))


def _train_step(model, x):
    out = model(x)
    out.square().mean().backward()
    grads = [p.grad.clone() for p in model.parameters()] + [x.grad.clone()]
    model.zero_grad()
    x.grad = None
    return out.detach(), grads


def test_training_through_autows_matches_eager(pretend):
    torch.manual_seed(0)
    model = Block()
    x = torch.randn(2, 16, 32, requires_grad=True)
    ref_out, ref_grads = _train_step(model, x)
    out, grads = _train_step(torch.compile(model, backend="autows"), x)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, atol=1e-5, rtol=1e-4)
    assert support.site_counters["attention.rewritten"] == 2
    assert support.site_counters["gemm.rewritten"] > 0  # forward and backward GEMMs (post-grad pass)
    ran = fallback.counters["attention.autows"] + fallback.counters["attention.fallback"]
    assert ran >= 2  # the custom op ran (on CPU it falls back inside)


def test_cpu_goes_to_inductor_with_one_log_line_per_reason(log_warnings):
    torch.manual_seed(0)
    model = nn.Sequential(Block(), Block()).eval()
    x = torch.randn(2, 16, 32)
    with torch.no_grad():
        ref = model(x)
        out = torch.compile(model, backend="autows")(x)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    assert support.site_counters["attention.rewritten"] == 0
    msgs = [r.getMessage() for r in log_warnings.records]
    att = [m for m in msgs if m.startswith("autows attention: left to Inductor") and "tensors on cpu" in m]
    gemm = [m for m in msgs if m.startswith("autows gemm: left to Inductor") and "tensors on cpu" in m]
    assert len(att) == 1 and len(gemm) == 1, msgs
    assert support.site_counters["attention.left"] == 4


def test_dynamic_sequence_length(pretend):
    torch.manual_seed(0)
    model = Block().eval()
    compiled = torch.compile(model, backend="autows")
    from torch._dynamo.utils import counters

    counters.clear()
    with torch.no_grad():
        for s in (16, 24, 40):
            x = torch.randn(2, s, 32)
            torch._dynamo.mark_dynamic(x, 1)
            torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-5)
    assert counters["stats"]["unique_graphs"] == 1
    assert support.site_counters["attention.rewritten"] == 2


def test_config_patches_for_modes_and_user_passes():
    from torch._inductor import list_mode_options

    def user_pass(graph):
        pass

    p = backend._config_patches("reduce-overhead", {"post_grad_custom_post_pass": user_pass, "max_autotune": True})
    assert all(p[k] == v for k, v in list_mode_options("reduce-overhead").items())
    assert p["max_autotune"] is True
    post = p["post_grad_custom_post_pass"]
    assert isinstance(post, graph_passes.AutoWSPostGradPass) and post.user is user_pass
    assert "pre_grad_custom_pass" not in p  # the backend rewrites attention itself, before compile_fx
    assert post.uuid() is None  # the user's plain function has no uuid: Inductor must not cache
    assert backend._config_patches(None, None)["post_grad_custom_post_pass"].uuid()


def test_backend_registered_in_process():
    from torch._dynamo.backends.registry import lookup_backend

    fn = lookup_backend("autows")
    # either the entry point itself or the thin wrapper `import torch_autows` registers, which delegates to it
    assert fn is backend.autows or (fn.__module__ == "torch_autows" and fn.__name__ == "autows")
