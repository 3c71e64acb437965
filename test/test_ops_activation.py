"""ops.gemm(..., activation=): argument checks, the CPU fallback (torch.addmm/mm then F.gelu) against torch, the
custom op ``autows::gemm_act`` (fake impl, no backward: a call needing grad runs torch), its extern kernels' three
paths (vendor: cuBLAS then torch's gelu; Unsupported: torch; served), and the runtime's config choice and refusals
for the activation epilogue (the exact gelu on 128-wide tiles only)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torch_autows
import torch_autows.custom_ops  # noqa: F401  (registers autows::gemm_act)
from torch_autows.runtime import fallback
from torch_autows.runtime import gemm as rt
from torch_autows.runtime.fallback import Unsupported


@pytest.fixture(autouse=True)
def _reset():
    fallback.reset()


def test_invalid_activation():
    a, b = torch.randn(4, 8), torch.randn(8, 6)
    with pytest.raises(ValueError, match="activation 'relu' not served; use None, 'gelu_tanh', 'gelu'"):
        torch_autows.ops.gemm(a, b, activation="relu")
    with pytest.raises(ValueError, match="activation 'tanh' not served"):
        torch_autows.ops.gemm(a, b, activation="tanh")
    with pytest.raises(ValueError, match="an activation and a residual in one call are not served"):
        torch_autows.ops.gemm(a, b, residual=torch.randn(4, 6), activation="gelu")
    with pytest.raises(ValueError, match="activation 'x' not served"):
        torch.ops.autows.gemm_act(a, b, "x")


@pytest.mark.parametrize("dtype,out_dtype", [(torch.float32, None), (torch.bfloat16, None),
                                             (torch.bfloat16, torch.float32)])
@pytest.mark.parametrize("activation,approx", [("gelu_tanh", "tanh"), ("gelu", "none")])
def test_cpu_falls_back_to_torch_with_reason(caplog, dtype, out_dtype, activation, approx):
    torch.manual_seed(0)
    a, b, bias = (torch.randn(s).to(dtype) for s in ((33, 17), (17, 9), (9,)))
    with caplog.at_level("WARNING", logger="torch_autows"):
        out = torch_autows.ops.gemm(a, b, bias=bias, out_dtype=out_dtype, activation=activation)
    want = F.gelu(a.float() @ b.float() + bias.float(), approximate=approx)
    assert out.dtype == (out_dtype or dtype) and out.shape == (33, 9)
    tol = 1e-5 if dtype == torch.float32 else 5e-2
    torch.testing.assert_close(out.float(), want, rtol=tol, atol=tol)
    assert fallback.counters["gemm.fallback"] == 1 and "tensors on cpu" in caplog.text
    assert not torch.allclose(out.float(), a.float() @ b.float() + bias.float(), atol=0.1)  # the GELU is applied
    no_bias = torch_autows.ops.gemm(a, b, activation=activation)
    torch.testing.assert_close(no_bias.float(), F.gelu(a.float() @ b.float(), approximate=approx).to(no_bias.dtype)
                               .float(), rtol=tol, atol=tol)
    assert torch.equal(torch_autows.ops.gemm(a, b, activation=None), torch_autows.ops.gemm(a, b))


def test_grad_inputs_run_torch_differentiably(caplog):
    a, b = torch.randn(5, 7, requires_grad=True), torch.randn(7, 3, requires_grad=True)
    with caplog.at_level("WARNING", logger="torch_autows"):
        out = torch_autows.ops.gemm(a, b, activation="gelu_tanh")
    out.sum().backward()
    a2, b2 = a.detach().requires_grad_(), b.detach().requires_grad_()
    F.gelu(a2 @ b2, approximate="tanh").sum().backward()
    torch.testing.assert_close(a.grad, a2.grad)
    torch.testing.assert_close(b.grad, b2.grad)
    assert fallback.counters["gemm.fallback"] == 1 and "the activation epilogue has no backward" in caplog.text


def test_custom_op_fake():
    a, b, bias = (torch.randn(s, dtype=torch.float64) for s in ((5, 7), (7, 3), (3,)))
    torch.library.opcheck(torch.ops.autows.gemm_act.default, (a, b, "gelu_tanh", bias, None),
                          test_utils=("test_schema", "test_faketensor"))
    got = torch.ops.autows.gemm_act(a, b, "gelu", bias)
    torch.testing.assert_close(got, F.gelu(torch.addmm(bias, a, b)))


def _mm(a, b, bias, out, activation="none"):
    c = torch.addmm(bias, a, b, out=out) if bias is not None else torch.mm(a, b, out=out)
    return c if activation == "none" else c.copy_(F.gelu(c, approximate="tanh" if activation == "gelu_tanh" else
                                                          "none"))


@pytest.mark.parametrize("path", ["vendor", "unsupported", "served"])
def test_extern_paths(monkeypatch, path):
    from types import SimpleNamespace

    from torch_autows import ops
    from torch_autows.inductor import externs

    seen = []

    def gemm(a, b, bias, out_dtype, out=None, residual=None, activation="none"):
        seen.append(activation)
        if path == "unsupported":
            raise Unsupported("a reason")
        return None if path == "vendor" else _mm(a, b, bias, out, activation)

    monkeypatch.setattr(ops, "runtime_module", lambda name: SimpleNamespace(gemm=gemm, vendor_gemm=_mm)
                        if name == "gemm" else None)
    torch.manual_seed(0)
    a, b, bias = torch.randn(8, 16), torch.randn(16, 4), torch.randn(4)
    out = torch.full((8, 4), float("nan"))
    externs.autows_mm_gelu_tanh(a, b, bias, out=out)
    torch.testing.assert_close(out, F.gelu(torch.addmm(bias, a, b), approximate="tanh"))
    externs.autows_mm_gelu(a, b, out=out)
    torch.testing.assert_close(out, F.gelu(a @ b))
    assert seen == ["gelu_tanh", "gelu"]
    counter = {"vendor": "gemm.vendor", "unsupported": "gemm.fallback", "served": "gemm.autows"}[path]
    assert fallback.counters[counter] == 2


def test_runtime_configs_and_refusals():
    for m in (1, 64, 128, 4096):
        assert rt.CONFIGS[rt.choose_config(m, 3072, 768, activation="gelu")].block_n <= rt.RESIDUAL_BLOCK_N
    # the tanh form is served by every config: the heuristic's pick is the plain GEMM's
    assert rt.choose_config(4096, 4096, 4096, activation="gelu_tanh") == rt.choose_config(4096, 4096, 4096)
    assert rt.choose_config(8, 4096, 4096, activation="gelu_tanh") == rt.choose_config(8, 4096, 4096)
    assert [c for c, o in rt.CONFIGS.items() if not rt.serves_activation(c, "gelu_tanh") and not o.swap_ab] \
        == ["ws_np_128x256"]
    assert not any(rt.serves_activation(c, act) for c, o in rt.CONFIGS.items() if o.swap_ab
                   for act in ("gelu_tanh", "gelu"))  # the swap-AB epilogue stores the biased product only
    assert not rt.serves_activation("ws_p_128x256", "gelu") and rt.serves_activation("ws_p_128x128", "gelu")
    a, b = torch.randn(4, 8), torch.randn(8, 16)
    with pytest.raises(Unsupported, match="does not serve activation 'gelu': its registers would spill"):
        rt.gemm(a, b, None, torch.float32, config="ws_p_128x256", activation="gelu")


@pytest.mark.parametrize("activation,approx", [("gelu_tanh", "tanh"), ("gelu", "none")])
def test_vendor_side_is_the_gemm_then_torchs_gelu(activation, approx):
    """What the measured choice compares against (the default's GEMM and pointwise kernel), into ``out``."""
    torch.manual_seed(0)
    a, b, bias = torch.randn(8, 16), torch.randn(16, 4), torch.randn(4)
    out = torch.full((8, 4), float("nan"))
    got = rt.vendor_gemm(a, b, bias, out, activation)
    assert got.data_ptr() == out.data_ptr()
    torch.testing.assert_close(out, F.gelu(torch.addmm(bias, a, b), approximate=approx))
    torch.testing.assert_close(rt.vendor_gemm(a, b, None, torch.empty(8, 4)), a @ b)
