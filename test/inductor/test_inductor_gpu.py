"""The Inductor integration on an sm_90 GPU: skipped on machines without one (the default CI is CPU only)."""
from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.functional as F

from torch_autows.inductor import support
from torch_autows.runtime import fallback

sm90 = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
pytestmark = pytest.mark.skipif(not sm90, reason="needs a CUDA sm_90 GPU (H100/H200)")


def _qkv(dtype=torch.bfloat16, b=2, h=8, hkv=8, s=256, d=128):
    mk = lambda hh: torch.randn(b, hh, s, d, device="cuda", dtype=dtype, requires_grad=True)  # noqa: E731
    return mk(h), mk(hkv), mk(hkv)


@pytest.mark.parametrize("path", ["cudnn", "flash"])
@pytest.mark.parametrize("causal,hkv,layout", [(False, 8, "bhsd"), (True, 8, "bshd"), (True, 2, "bshd"),
                                               (False, 2, "bhsd"), (True, 2, "bshd-grad-contiguous")])
def test_backward_matches_sdpa(path, causal, hkv, layout, monkeypatch):
    # both torch backwards we call, against fp32 SDPA's autograd: grouped k/v heads, [B, S, H, D] views (as
    # models transpose them), and an upstream grad in another layout than out's
    import torch_autows.custom_ops  # noqa: F401  (registers torch.ops.autows.*)
    from torch_autows import attention_grad

    b, h, s, d = 2, 8, 256, 128
    if layout == "bhsd":
        q, k, v = _qkv(hkv=hkv)
    else:
        mk = lambda hh: torch.randn(b, s, hh, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)  # noqa: E731
        q, k, v = (t.requires_grad_() for t in (mk(h), mk(hkv), mk(hkv)))
    if path == "flash":
        monkeypatch.setattr(attention_grad, "cudnn_backward_ok", lambda *args: False)
    else:
        assert attention_grad.cudnn_backward_ok(q, k, causal, None)
    out, lse = torch.ops.autows.attention(q, k, v, causal, None, hkv != 8)
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal, enable_gqa=hkv != 8)
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)
    g = torch.randn_like(out)
    if layout == "bshd-grad-contiguous":
        g = g.contiguous()
        assert g.stride() != out.stride()
    ours = torch.autograd.grad(out, (q, k, v), g)
    theirs = torch.autograd.grad(ref, (q, k, v), g.float())
    for a, r in zip(ours, theirs):
        assert ((a.float() - r).norm() / r.norm()).item() < 1e-2


class Block(torch.nn.Module):
    def __init__(self, dim=1024, heads=8):
        super().__init__()
        self.h = heads
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.o = torch.nn.Linear(dim, dim)

    def forward(self, x):
        B, S, D = x.shape
        q, k, v = self.qkv(x).view(B, S, 3, self.h, D // self.h).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(F.gelu(y.transpose(1, 2).reshape(B, S, D)))


@pytest.mark.parametrize("mode", [None, "reduce-overhead", "max-autotune-no-cudagraphs"])
def test_block_training(mode):
    torch._dynamo.reset()
    fallback.reset()
    support.reset()
    torch.manual_seed(0)
    model = Block().cuda().to(torch.bfloat16)
    ref_model = Block().cuda()
    ref_model.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
    compiled = torch.compile(model, backend="autows", mode=mode)
    for _ in range(3):  # cudagraph trees record on a later call
        # Grads cleared each step, as a training loop does: accumulating into .grad across steps reads a
        # cudagraph output a later replay overwrote, which torch rejects for plain Inductor too (H200, 2.11).
        model.zero_grad(set_to_none=True)
        x = torch.randn(4, 256, 1024, device="cuda", dtype=torch.bfloat16)
        out = compiled(x)
        out.float().square().mean().backward()
    ref = ref_model(x.float())
    torch.testing.assert_close(out.float(), ref, atol=5e-2, rtol=5e-2)
    assert fallback.counters["gemm.autows"] + fallback.counters["bmm.autows"] >= 1  # GEMM sites served
    if importlib.util.find_spec("torch_autows.runtime.attention") is not None:  # attention kernel exists
        assert support.site_counters["attention.rewritten"] >= 1


def test_dynamic_sequence_length():
    torch._dynamo.reset()
    model = Block().cuda().to(torch.bfloat16).eval()
    compiled = torch.compile(model, backend="autows")
    with torch.no_grad():
        for s in (128, 256, 384):
            x = torch.randn(2, s, 1024, device="cuda", dtype=torch.bfloat16)
            torch._dynamo.mark_dynamic(x, 1)
            torch.testing.assert_close(compiled(x).float(), model(x).float(), atol=5e-2, rtol=5e-2)


def test_compiled_wrapper_calls_our_functions_directly():
    # on the GPU's torch (2.11) too: GEMMs and attention are direct calls, not torch.ops.autows through the
    # dispatcher (lowering.py), and each served call is counted
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    fallback.reset()
    model = Block().cuda().to(torch.bfloat16).eval()
    x = torch.randn(2, 256, 1024, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        out, code = run_and_get_code(torch.compile(model, backend="autows"), x)
        torch.testing.assert_close(out.float(), model(x).float(), atol=5e-2, rtol=5e-2)
    src = "\n".join(code)
    assert "extern_kernels.autows_attention(" in src and src.count("extern_kernels.autows_addmm(") == 2
    assert "torch.ops.autows.attention.default(" not in src and "torch.ops.autows.gemm.default(" not in src
    assert fallback.counters["attention.autows"] == 1 and fallback.counters["gemm.autows"] == 2
