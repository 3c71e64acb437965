"""ops.gemm_swiglu: invalid arguments raise TypeError/ValueError; valid CPU calls fall back to torch, correctly,
with the reason logged once and counted."""
from __future__ import annotations

import pytest
import torch

import torch_autows
from torch_autows.runtime import fallback


@pytest.fixture(autouse=True)
def _reset():
    fallback.reset()


def _ref(a, wg, wu):
    a = a.double()
    return torch.nn.functional.silu(a @ wg.double()) * (a @ wu.double())


def test_invalid_arguments():
    a, w = torch.randn(4, 8), torch.randn(8, 6)
    swiglu = torch_autows.ops.gemm_swiglu
    with pytest.raises(TypeError, match="torch.Tensor"):
        swiglu([[1.0]], w, w)
    with pytest.raises(ValueError, match="w_up must be 2-D"):
        swiglu(a, w, w[0])
    with pytest.raises(ValueError, match="both must be \\[K, N\\]"):
        swiglu(a, w, torch.randn(8, 5))
    with pytest.raises(ValueError, match="for nn.Linear weights \\[N, K\\], pass w.t\\(\\)"):
        swiglu(a, w.t(), w.t())
    with pytest.raises(TypeError, match="cast them to one dtype"):
        swiglu(a, w, w.half())
    with pytest.raises(TypeError, match="dtype torch.int64"):
        swiglu(a.long(), w.long(), w.long())
    with pytest.raises(TypeError, match="out_dtype"):
        swiglu(a, w, w, out_dtype="bf16")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_falls_back_with_reason(caplog, dtype):
    torch.manual_seed(0)
    a, wg, wu = torch.randn(33, 40), torch.randn(64, 40) / 8, torch.randn(64, 40) / 8  # nn.Linear [N, K] weights
    a, wg, wu = a.to(dtype), wg.to(dtype), wu.to(dtype)
    with caplog.at_level("WARNING", logger="torch_autows"):
        out = torch_autows.ops.gemm_swiglu(a, wg.t(), wu.t())
        torch_autows.ops.gemm_swiglu(a, wg.t(), wu.t())
    assert out.shape == (33, 64) and out.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.double(), _ref(a, wg.t(), wu.t()), atol=tol, rtol=tol)
    assert fallback.counters["gemm_swiglu.fallback"] == 2 and fallback.counters["gemm_swiglu.autows"] == 0
    assert caplog.text.count("gemm_swiglu: falling back to torch") == 1  # logged once
    assert "the generated kernels run on CUDA sm_90 GPUs" in caplog.text


def test_out_dtype_float32():
    a, w = torch.randn(5, 16, dtype=torch.bfloat16), torch.randn(16, 8, dtype=torch.bfloat16)
    out = torch_autows.ops.gemm_swiglu(a, w, w * 2, out_dtype=torch.float32)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), _ref(a, w, w * 2), atol=1e-5, rtol=1e-5)


def test_grad_goes_through_torch():
    a = torch.randn(3, 8, requires_grad=True)
    wg, wu = torch.randn(8, 4), torch.randn(8, 4)
    out = torch_autows.ops.gemm_swiglu(a, wg, wu)
    out.sum().backward()
    ref_a = a.detach().clone().requires_grad_()
    (torch.nn.functional.silu(ref_a @ wg) * (ref_a @ wu)).sum().backward()
    torch.testing.assert_close(a.grad, ref_a.grad)
    assert fallback.counters["gemm_swiglu.fallback"] == 1


def test_vendor_choice_runs_what_compile_default_runs(monkeypatch):
    # runtime.choice kept the vendor's side: the call runs two GEMMs and one fused product (runtime.vendor_swiglu),
    # not eager torch's two pointwise kernels
    calls = []

    class FakeRuntime:
        @staticmethod
        def gemm_swiglu(a, bg, bu, out_dtype):
            return None  # the vendor is faster for this shape

        @staticmethod
        def vendor_swiglu(a, bg, bu, out):
            calls.append(out.shape)
            return out.copy_(torch.nn.functional.silu(a @ bg) * (a @ bu))

    monkeypatch.setattr(torch_autows.ops, "runtime_module", lambda name: FakeRuntime if name == "swiglu" else None)
    fallback.reset()
    a, wg, wu = torch.randn(3, 16), torch.randn(16, 8), torch.randn(16, 8)
    out = torch_autows.ops.gemm_swiglu(a, wg, wu)
    assert calls == [torch.Size([3, 8])] and fallback.counters["gemm_swiglu.vendor"] == 1
    torch.testing.assert_close(out, torch.nn.functional.silu(a @ wg) * (a @ wu))


def test_swap_ab_config_where_the_measurement_kept_it_and_the_layout_allows(monkeypatch):
    """runtime.swiglu runs the config the measured choice kept: a swap-AB one for nn.Linear weights (C through a
    pointer, its tile being C^T's), the heuristic's for row-major weights; a named swap config on row-major weights
    is refused with what to do."""
    from types import SimpleNamespace

    from torch_autows.runtime import choice
    from torch_autows.runtime import device as dev
    from torch_autows.runtime import gemm as rg
    from torch_autows.runtime import swiglu as rs
    from torch_autows.runtime.fallback import Unsupported
    from torch_autows.runtime.launch import Tma
    from torch_autows.templates.gemm import build

    seen = []

    class Launcher:  # what launch_template hands the C launcher: C a TMA descriptor, or a pointer (swap-AB)
        def ordered(self, values):
            seen.append(sorted(n for n in ("a", "b", "bu", "c") if not isinstance(values[n], Tma)))
            return []

        def __call__(self, grid, args, idx):
            pass

        def bind(self, grid, args, idx):
            return None

    monkeypatch.setattr(rs, "support_reason", lambda *a, **k: None)
    monkeypatch.setattr(rg, "compile_kernel", lambda kind, req, options: SimpleNamespace(
        launcher=Launcher(), program=build(req, options)))  # the Program's args say TMA or pointer
    monkeypatch.setattr(dev, "index", lambda d: 0)
    monkeypatch.setattr(dev, "num_sms", lambda i: 132)
    monkeypatch.setattr(rs, "_decide", lambda *a: choice.Decision(True, "measured", 1.0, 2.0, 0.0,
                                                                  "swiglu_decs_64x128_m16_s1"))
    rs._BOUND.clear()
    x, wg, wu = torch.randn(4, 64).bfloat16(), torch.randn(96, 64).bfloat16(), torch.randn(96, 64).bfloat16()
    rs.gemm_swiglu(x, wg.t(), wu.t(), torch.bfloat16)
    rs.gemm_swiglu(x, wg.t().contiguous(), wu.t().contiguous(), torch.bfloat16)
    with pytest.raises(Unsupported, match="swiglu_decs_64x128_m16_s1 is swap-AB.*nn.Linear's layout"):
        rs.gemm_swiglu(x, wg.t().contiguous(), wu.t().contiguous(), torch.bfloat16, config="swiglu_decs_64x128_m16_s1")
    rs._BOUND.clear()
    assert seen == [["c"], []]  # pointers among a, b, bu, c: the swap-AB launch's C only
    monkeypatch.setattr(rs, "OFFER_SWAP", False)
    assert rs.decode_candidates(8, 14336, 4096, swap=True) == [rs.choose_config(8, 14336, 4096)]  # not offered
    monkeypatch.setattr(rs, "OFFER_SWAP", True)
    assert rs.decode_candidates(8, 14336, 4096, swap=True)[1:] == ["swiglu_decs_64x128_m16_s1",
                                                                    "swiglu_decs_128x128_m16_s1"]
    assert rs.decode_candidates(8, 14336, 4096, swap=False) == [rs.choose_config(8, 14336, 4096)]
