"""The RoPE GEMM (runtime.gemm_rope) on sm_90 against the unfused fp32 reference (nn.Linear then the Llama example's
apply_rope): every config serving the epilogue, head dims 64/128, ragged rows and K, tables of a sequence's positions
(rows [batch, sequence] flattened) and of one row each, a bias, nn.Linear's and the row-major weight layout. Outputs
are poisoned with NaN before each run, so an unwritten element fails the check; the error must be within the
unfused bf16 path's own distance to fp32 (the fused kernel rounds once, the unfused path three times)."""
from __future__ import annotations

import pytest
import torch

from torch_autows.bench.llama import LlamaConfig, apply_rope, rope_tables
from torch_autows.runtime import gemm as rt
from torch_autows.runtime.fallback import Unsupported
from torch_autows.runtime.gemm_rope import WIDE, gemm_rope, serves

SHAPES = [(1, 1, 512), (2, 77, 520), (4, 256, 4096), (1, 1000, 1024)]  # (batch, sequence, K)


def _rel(out, ref):
    return ((out.float() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("config,d", [(c, d) for c in (*rt.CONFIGS, *WIDE) for d in (64, 128) if serves(c, d)])
def test_numerics(config, d, shape):
    B, S, K = shape
    heads = 3 if d == 64 else 5 if config in WIDE else 2  # the wide tile: two heads a tile, the last tile half full
    g = torch.Generator(device="cuda").manual_seed(B * S + K)
    x = torch.randn(B * S, K, device="cuda", dtype=torch.bfloat16, generator=g)
    w = torch.randn(heads * d, K, device="cuda", dtype=torch.bfloat16, generator=g) / K ** 0.5
    bias = torch.randn(heads * d, device="cuda", dtype=torch.bfloat16, generator=g) if S % 2 else None
    cos, sin = rope_tables(LlamaConfig(head_dim=d), S, device="cuda")
    cos16, sin16 = cos.to(torch.bfloat16), sin.to(torch.bfloat16)
    for b, layout in ((w.t(), "w.t()"), (w.t().contiguous(), "row-major")):
        out = torch.full((B * S, heads * d), float("nan"), device="cuda", dtype=torch.bfloat16)
        if config in WIDE and S % 128 and S < B * S:  # its tables by TMA only: no tile of rows may wrap the table
            with pytest.raises(Unsupported, match="TMA tiles"):
                gemm_rope(x, b, cos16, sin16, bias=bias, config=config, out=out)
            continue
        got = gemm_rope(x, b, cos16, sin16, bias=bias, config=config, out=out)
        assert got is out and not out.isnan().any(), layout
        y = torch.nn.functional.linear(x.float(), w.float(), None if bias is None else bias.float())
        heads_view = y.view(B, S, heads, d).transpose(1, 2)
        ref = apply_rope(heads_view, cos16.float(), sin16.float()).transpose(1, 2).reshape(B * S, heads * d)
        unfused = apply_rope(torch.nn.functional.linear(x, w, bias).view(B, S, heads, d).transpose(1, 2), cos, sin)
        err, base = _rel(out, ref), _rel(unfused.transpose(1, 2).reshape(B * S, heads * d), ref)
        assert err <= max(base, 2e-3), f"{config} {layout}: {err:.2e} against the unfused path's {base:.2e}"


def test_a_table_per_row():
    """P = M: each row its own position (a decode batch at different lengths)."""
    x = torch.randn(5, 256, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(128, 256, device="cuda", dtype=torch.bfloat16) / 16
    cos, sin = rope_tables(LlamaConfig(), 4096, device="cuda")
    pos = torch.tensor([0, 7, 100, 4000, 3], device="cuda")
    c16, s16 = cos[pos].to(torch.bfloat16), sin[pos].to(torch.bfloat16)
    out = gemm_rope(x, w.t(), c16, s16)
    y = (x.float() @ w.float().t()).view(5, 1, 128)
    ref = apply_rope(y, c16.float().view(5, 1, 128), s16.float().view(5, 1, 128)).view(5, 128)
    assert _rel(out, ref) < 4e-3


def test_vendor_path_and_op():
    """What the measured choice times against the fused kernel (cuBLAS, then one pointwise RoPE kernel) computes the
    same RoPE; ``autows::gemm_rope`` (the compiled graph's op) serves the call."""
    import torch_autows.custom_ops  # noqa: F401
    from torch_autows.ops import torch_gemm_rope
    from torch_autows.runtime.gemm_rope import site_decision, vendor_rope

    B, S, H, D, K = 2, 300, 4, 128, 512
    x = torch.randn(B * S, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(H * D, K, device="cuda", dtype=torch.bfloat16) / K ** 0.5
    bias = torch.randn(H * D, device="cuda", dtype=torch.bfloat16)
    cos, sin = (t.to(torch.bfloat16) for t in rope_tables(LlamaConfig(), S, device="cuda"))
    ref = torch_gemm_rope(x, w.t(), cos, sin, bias).float()
    out = torch.full((B * S, H * D), float("nan"), device="cuda", dtype=torch.bfloat16)
    vendor_rope(x, w.t(), cos, sin, bias, out)
    assert _rel(out, ref) < 1e-2
    got = torch.ops.autows.gemm_rope(x, w.t(), cos, sin, bias)
    assert _rel(got, ref) < 4e-3
    import torch_autows

    with torch_autows.config.patch(choice="measure"):  # (tests force "autows": conftest.py) times both sides
        assert site_decision(x, w.t(), cos, sin, bias).source in ("measured", "cache")
