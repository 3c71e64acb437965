"""The attention runtime's 2-D TMA views of q/k/v: every element (b, h, s, d) the kernel addresses as
row b*rb + h*rh + s, column h*ch + d of the view is that element of the tensor (checked on CPU)."""
from __future__ import annotations

import itertools

import pytest
import torch

from torch_autows.runtime.attention import _kv_views, _rows_view, _tma


def _layouts(B, H, S, D):
    base = torch.randn(B, H, S, D)
    yield "bhsd", base, False
    yield "bshd", torch.randn(B, S, H, D).transpose(1, 2), False  # as models produce it
    yield "sliced", torch.randn(B, H, S, 2 * D)[..., :D], False   # [B, H, S, D] rows with a longer pitch
    for i in range(3):  # q, k, v of a fused QKV projection: [B, S, H, D] rows, pitch 3*H*D, offset i*H*D
        yield f"qkv{i}", torch.randn(B, S, 3, H, D).permute(2, 0, 3, 1, 4)[i], False
    # heads D*2 apart in a [B, S, H, 2D] row: neither order, copied (with one position, [B, H] rows of pitch 2D)
    yield "heads-apart", torch.randn(B, S, H, 2 * D).transpose(1, 2)[..., :D], S > 1
    yield "d-strided", torch.randn(B, H, D, S).transpose(2, 3), True                # neither: copied


@pytest.mark.parametrize("shape", [(2, 3, 5, 8), (1, 1, 1, 16), (3, 2, 129, 64), (1, 4, 1, 8)])
def test_rows_view_addresses_every_element(shape):
    B, H, S, D = shape
    for name, t, copied in _layouts(*shape):
        view = _rows_view(t)
        src, rb, rh, ch, _ = view
        in_place = t.is_contiguous() or t.transpose(1, 2).is_contiguous()  # size-1 dims: strides do not matter
        assert (src.data_ptr() != t.data_ptr()) == (copied and not in_place), name
        tma = _tma(view)
        assert tma.tensor is src
        (rows, cols), (ld, one) = tma.shape, tma.strides
        assert one == 1
        flat = torch.as_strided(src, (rows, cols), (ld, 1))  # what TMA reads
        b, h, s = torch.meshgrid(torch.arange(B), torch.arange(H), torch.arange(S), indexing="ij")
        r = (b * rb + h * rh + s)[..., None]
        c = (h * ch)[..., None] + torch.arange(D)
        assert int(r.max()) < rows and int(c.max()) < cols, name
        assert torch.equal(flat[r, c], t), name


def _addresses(view, t):
    """Every element (b, h, s, d) of t is at row b*rb + h*rh + s, column h*ch + d of the view's TMA rows."""
    B, H, S, D = t.shape
    src, rb, rh, ch, _ = view
    tma = _tma(view)
    (rows, cols), (ld, one) = tma.shape, tma.strides
    flat = torch.as_strided(src, (rows, cols), (ld, 1))
    b, h, s = torch.meshgrid(torch.arange(B), torch.arange(H), torch.arange(S), indexing="ij")
    r, c = (b * rb + h * rh + s)[..., None], (h * ch)[..., None] + torch.arange(D)
    return one == 1 and int(r.max()) < rows and int(c.max()) < cols and torch.equal(flat[r, c], t)


@pytest.mark.parametrize("shape", [(2, 3, 5, 8), (2, 2, 1, 8), (1, 1, 1, 16), (2, 1, 3, 8)])
def test_k_and_v_share_a_row_order(shape):
    # The kernel reads v with k's (rb, rh, ch). With one key position both orders fit some layouts: a fused
    # projection's k ([B, S, H, D] rows) next to a contiguous v once gave v the other order (wrong numbers).
    layouts = list(_layouts(*shape))
    for (kn, k, _), (vn, v, _) in itertools.product(layouts, layouts):
        kv, vv = _kv_views(k, v)
        assert kv[1:4] == vv[1:4], (kn, vn)
        assert _addresses(kv, k) and _addresses(vv, v), (kn, vn)


@pytest.mark.parametrize("shape", [(2, 3, 5, 8), (1, 4, 7, 16)])
def test_output_takes_qs_layout(shape):
    from torch_autows.runtime.attention import _in_place, empty_out

    B, H, S, D = shape
    bshd = torch.randn(B, S, H, D).transpose(1, 2)
    out = empty_out(bshd)
    assert out.shape == bshd.shape and out.stride() == bshd.stride()
    assert _in_place(out)[1:] == (S, 0, D, H * D)
    assert empty_out(bshd.contiguous()).is_contiguous() and empty_out(bshd, 4).shape == (B, H, S, 4)
    qkv = torch.randn(B, S, 3, H, D).permute(2, 0, 3, 1, 4)
    assert empty_out(qkv[1]).stride() == bshd.stride()  # a fused projection's q: O in packed [B, S, H, D]
    assert _in_place(torch.randn(B, S, H, 2 * D).transpose(1, 2)[..., :D]) is None  # heads apart: not in place


def test_raw_max_only_for_positive_scales():
    from torch_autows.runtime.attention import CONFIGS, options_for

    assert options_for("ws_p_128x128_q2_rm", 0.125).raw_max
    for scale in (0.0, -0.3):  # max on unscaled scores is wrong there: the scaled form is built instead
        o = options_for("ws_p_128x128_q2_rm", scale)
        assert not o.raw_max and o == CONFIGS["ws_p_128x128_q2"]
    assert options_for("ws_p_128x128_q2", -1.0) is CONFIGS["ws_p_128x128_q2"]


@pytest.mark.parametrize("shape", [(2, 3, 5, 8), (2, 1, 3, 8), (1, 4, 1, 16)])
def test_own_cols_views_end_at_the_head_dim(shape):
    """Tiles wider than D (d=96 in 128 columns): q, k and v are read through views whose TMA rows are one head's D
    columns, so the padding columns are out of bounds (zeros), never the next head's values; [B, S, H, D] rows
    with several heads are copied to [B, H, S, D]."""
    B, H, S, D = shape
    layouts = list(_layouts(*shape))
    for name, t, _ in layouts:
        view = _rows_view(t, own_cols=True)
        assert _addresses(view, t) and _tma(view).shape[1] == D, name
        assert (_tma(_rows_view(t)).shape[1] == D) == (H == 1 or not _rows_view(t)[3]), name  # the default may not
    for (kn, k, _), (vn, v, _) in itertools.product(layouts, layouts):
        kv, vv = _kv_views(k, v, own_cols=True)
        assert kv[1:4] == vv[1:4] and _addresses(kv, k) and _addresses(vv, v), (kn, vn)
        assert _tma(kv).shape[1] == D and _tma(vv).shape[1] == D, (kn, vn)
