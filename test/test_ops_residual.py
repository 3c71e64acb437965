"""ops.gemm(..., residual=): argument checks, the CPU fallback (torch.mm/addmm, then the residual added), the
custom op ``autows::gemm_residual`` (fake impl, autograd: the residual's gradient is the output's), and the
runtime's support checks and config choice for the residual epilogue (R by TMA on unsplit tiles of any width, by
pointers on 128-wide split-K ones)."""
from __future__ import annotations

import pytest
import torch
from programs import fake_cuda

import torch_autows
import torch_autows.custom_ops  # noqa: F401  (registers autows::gemm_residual)
from torch_autows.runtime import fallback
from torch_autows.runtime import gemm as rt
from torch_autows.runtime.fallback import Unsupported


@pytest.fixture(autouse=True)
def _reset():
    fallback.reset()


def test_invalid_residual():
    a, b = torch.randn(4, 8), torch.randn(8, 6)
    with pytest.raises(TypeError, match="residual must be a torch.Tensor"):
        torch_autows.ops.gemm(a, b, residual=[[0.0]])
    with pytest.raises(ValueError, match="residual must be 2-D"):
        torch_autows.ops.gemm(a, b, residual=torch.randn(6))
    with pytest.raises(ValueError, match=r"residual must have the output's shape \[M, N\] = \[4, 6\], got \(6, 4\)"):
        torch_autows.ops.gemm(a, b, residual=torch.randn(6, 4))
    with pytest.raises(TypeError, match="residual has dtype torch.float16 but a has torch.float32; cast them"):
        torch_autows.ops.gemm(a, b, residual=torch.randn(4, 6).half())
    with pytest.raises(ValueError, match="residual is on meta but a is on cpu"):
        torch_autows.ops.gemm(a, b, residual=torch.empty(4, 6, device="meta"))


@pytest.mark.parametrize("dtype,out_dtype", [(torch.float32, None), (torch.bfloat16, None),
                                             (torch.bfloat16, torch.float32)])
def test_cpu_falls_back_to_addmm_with_reason(caplog, dtype, out_dtype):
    a, b, bias, r = (torch.randn(s).to(dtype) for s in ((33, 17), (17, 9), (9,), (33, 9)))
    with caplog.at_level("WARNING", logger="torch_autows"):
        out = torch_autows.ops.gemm(a, b, bias=bias, out_dtype=out_dtype, residual=r)
    want = a.float() @ b.float() + bias.float() + r.float()
    assert out.dtype == (out_dtype or dtype) and out.shape == (33, 9)
    tol = 1e-5 if dtype == torch.float32 else 5e-2
    torch.testing.assert_close(out.float(), want, rtol=tol, atol=tol)
    assert fallback.counters["gemm.fallback"] == 1
    assert "tensors on cpu" in caplog.text
    no_bias = torch_autows.ops.gemm(a, b, residual=r)
    torch.testing.assert_close(no_bias.float(), (a.float() @ b.float() + r.float()).to(no_bias.dtype).float(),
                               rtol=tol, atol=tol)


def test_custom_op_fake_and_autograd():
    a, b, bias, r = (torch.randn(s, dtype=torch.float64, requires_grad=True) for s in ((5, 7), (7, 3), (3,), (5, 3)))
    torch.library.opcheck(torch.ops.autows.gemm_residual.default, (a, b, r, bias, None))
    assert torch.autograd.gradcheck(torch.ops.autows.gemm_residual, (a, b, r, bias))
    assert torch.autograd.gradcheck(torch.ops.autows.gemm_residual, (a, b, r))
    a, b, r = (x.detach().float().requires_grad_(r is x) for x in (a, b, r))
    out = torch_autows.ops.gemm(a, b, residual=r)  # through the custom op (an input needs grad)
    g = torch.randn_like(out)
    out.backward(g)
    assert torch.equal(r.grad, g) and a.grad is None  # the residual's gradient is the output's
    with torch._subclasses.fake_tensor.FakeTensorMode():
        fa, fb, fr = torch.empty(5, 7), torch.empty(7, 3), torch.empty(5, 3)
        assert torch.ops.autows.gemm_residual(fa, fb, fr).shape == (5, 3)
        with pytest.raises(ValueError, match="residual must have the output's shape"):
            torch.ops.autows.gemm_residual(fa, fb, torch.empty(3, 5))


def test_support_reasons(monkeypatch):
    a, w = fake_cuda(8, 256), fake_cuda(512, 256)  # nn.Linear weight [N, K]: b = w.t()
    assert rt.support_reason(a, w.t(), None, None, fake_cuda(8, 512), check_device=False) is None
    assert rt.support_reason(a, w.t(), None, torch.float32, fake_cuda(8, 512), check_device=False) is None
    for bad in (fake_cuda(512, 8).t(), fake_cuda(8, 512, stride=(1024, 1)), fake_cuda(8, 512, dtype=torch.float16)):
        why = rt.support_reason(a, w.t(), None, None, bad, check_device=False)
        assert "contiguous [M, N] = [8, 512] tensor of the operands' dtype" in why, why
    from torch_autows.runtime import device as dev

    monkeypatch.setattr(dev, "sm90_reason", lambda device, check_device=True: None)  # CPU tensors: an address
    a, w = torch.randn(8, 256).bfloat16(), torch.randn(512, 256).bfloat16()
    odd = torch.randn(8 * 512 + 1).bfloat16()[1:].view(8, 512)  # R by TMA: 16-byte aligned
    assert "residual is not 16-byte aligned" in rt.support_reason(a, w.t(), None, None, odd, check_device=False)


def test_configs_that_serve_a_residual():
    assert rt.choose_config(8192, 4096, 4096) == "ws_p_128x256"
    assert rt.choose_config(8192, 4096, 4096, residual=True) == "ws_p_128x256"  # R by TMA: any width
    assert rt.choose_config(8192, 4096, 4096, residual=True, out32=True) == "ws_p_128x128"
    for m in (1, 16, 128):
        for n in (4096, 14336, 128256):
            assert rt.CONFIGS[rt.choose_config(m, n, 4096, residual=True)].block_n <= 128
    assert rt.CONFIGS[rt.choose_config(1, 1024, 4096, residual=True)].split_k > 1  # split-K serves it too
    # split-K loads R by pointers, which spill on wider tiles; a wider output has no SMEM to stage in on them
    assert [c for c, o in rt.CONFIGS.items() if not rt.serves_residual(c) and not o.swap_ab] == ["dec_256x64_s2"]
    assert [c for c, o in rt.CONFIGS.items() if not rt.serves_residual(c, out32=True) and not o.swap_ab] == [
        "ws_p_128x256", "ws_np_128x256", "ws_pp2_64x256", "dec_256x64_s1", "dec_256x64_s2"]
    assert not any(rt.serves_residual(c) for c, o in rt.CONFIGS.items() if o.swap_ab)  # swap-AB: the product only
    assert rt.residual_options("ws_p_128x256").epilogue_tma and not rt.residual_options("dec_128x128_s2").epilogue_tma
    a, b, r = torch.randn(4, 8).bfloat16(), torch.randn(8, 16).bfloat16(), torch.randn(4, 16).bfloat16()
    with pytest.raises(Unsupported, match="ws_p_128x256 .256-wide tiles. does not serve a residual with a "
                                          "torch.float32 output"):
        rt.gemm(a, b, None, torch.float32, config="ws_p_128x256", residual=r)
