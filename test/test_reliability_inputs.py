"""Bad and edge inputs for every public entry point (``ops.gemm/bmm/attention`` and
``torch.ops.autows.gemm/bmm/attention``): a clear TypeError/ValueError, or torch's result; and
``torch.library.opcheck`` on every custom op, empty and odd shapes included."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from torch_autows import ops

SDPA = F.scaled_dot_product_attention
OPS = torch.ops.autows
a, b = torch.randn(6, 5), torch.randn(5, 3)
A, B = torch.randn(2, 6, 5), torch.randn(2, 5, 3)
q, kv, kv2 = torch.randn(2, 4, 8, 16), torch.randn(2, 4, 10, 16), torch.randn(2, 2, 10, 16)
v24 = torch.randn(2, 2, 10, 24)  # a v head dim of its own
a7, b7 = torch.randn(7, 13), torch.randn(13, 5)


def _gemm(x, y, bias=None, out_dtype=None):
    """Each gemm entry point as a callable of the same arguments."""
    return [("ops.gemm", lambda: ops.gemm(x, y, bias, out_dtype)),
            ("autows::gemm", lambda: OPS.gemm(x, y, bias, out_dtype))]


def _bmm(x, y, out_dtype=None):
    return [("ops.bmm", lambda: ops.bmm(x, y, out_dtype)), ("autows::bmm", lambda: OPS.bmm(x, y, out_dtype))]


def _att(q, k, v, is_causal=False, scale=None, gqa=False):
    return [("ops.attention", lambda: ops.attention(q, k, v, is_causal=is_causal, scale=scale, enable_gqa=gqa)),
            ("autows::attention", lambda: OPS.attention(q, k, v, is_causal, scale, gqa))]


BAD = [  # (id, calls, exception, message pattern)
    ("gemm 1-D a", _gemm(a[0], b), ValueError, "2-D"),
    ("gemm 3-D a", _gemm(A, b), ValueError, "2-D"),
    ("gemm K mismatch", _gemm(a, b[:4]), ValueError, "a.shape\\[1\\] must equal"),
    ("gemm int", _gemm(a.int(), b.int()), TypeError, "dtype torch.int32"),
    ("gemm bool", _gemm(a.bool(), b.bool()), TypeError, "dtype torch.bool"),
    ("gemm complex", _gemm(a.to(torch.complex64), b.to(torch.complex64)), TypeError, "complex64"),
    ("gemm mixed dtypes", _gemm(a, b.half()), TypeError, "cast them to one dtype"),
    ("gemm bias length", _gemm(a, b, torch.randn(4)), ValueError, "bias must have shape"),
    ("gemm bias 2-D", _gemm(a, b, torch.randn(1, 3)), ValueError, "bias must have shape"),
    ("gemm bias dtype", _gemm(a, b, torch.randn(3).half()), TypeError, "cast them to one dtype"),
    ("gemm out_dtype int", _gemm(a, b, None, torch.int32), TypeError, "out_dtype"),
    ("gemm devices", _gemm(a, b.to("meta")), ValueError, "one device"),
    ("bmm 2-D", _bmm(a, b), ValueError, "3-D"),
    ("bmm batch", _bmm(A, B[:1]), ValueError, "\\[B, K, N\\]"),
    ("bmm K", _bmm(A, B[:, :4]), ValueError, "\\[B, K, N\\]"),
    ("bmm int", _bmm(A.long(), B.long()), TypeError, "dtype torch.int64"),
    ("attention 3-D q", _att(q[0], kv, kv), ValueError, "q must be 4-D"),
    ("attention 5-D k", _att(q, kv[None], kv), ValueError, "k must be 4-D"),
    ("attention head dim", _att(q, kv[..., :8], kv[..., :8]), ValueError, "head dims of q .* and k .* differ"),
    ("attention k head dim", _att(q, kv[..., :8], kv), ValueError, "head dims of q .* and k .* differ"),
    ("attention k/v lengths", _att(q, kv, kv[:, :, :9]), ValueError, "do not match"),
    ("attention batch", _att(q, kv[:1], kv[:1]), ValueError, "do not match"),
    ("attention GQA without flag", _att(q, kv2, kv2), ValueError, "enable_gqa=True"),
    ("attention GQA 4/3", _att(q, kv[:, :3], kv[:, :3], gqa=True), ValueError, "multiple of k/v heads"),
    ("attention more kv heads", _att(q[:, :2], kv, kv, gqa=True), ValueError, "multiple of k/v heads"),
    ("attention no kv heads", _att(q, kv[:, :0], kv[:, :0], gqa=True), ValueError, "0 heads"),
    ("attention int", _att(q.int(), kv.int(), kv.int()), TypeError, "dtype torch.int32"),
    ("attention mixed dtypes", _att(q, kv.half(), kv.half()), TypeError, "cast them to one dtype"),
    ("attention devices", _att(q, kv.to("meta"), kv.to("meta")), ValueError, "one device"),
]


@pytest.mark.parametrize("calls,exc,match", [pytest.param(c, e, m, id=i) for i, c, e, m in BAD])
def test_bad_inputs_raise_clear_errors(calls, exc, match):
    for _name, call in calls:
        with pytest.raises(exc, match=match):
            call()


@pytest.mark.parametrize("bad", [[[1.0]], 1.0, None])
def test_non_tensors_are_type_errors(bad):
    with pytest.raises(TypeError, match="torch.Tensor"):
        ops.gemm(bad, b)
    with pytest.raises(TypeError, match="torch.Tensor"):
        ops.attention(q, bad, kv)
    with pytest.raises((TypeError, RuntimeError)):  # the dispatcher checks the schema first
        OPS.gemm(bad, b)


@pytest.mark.parametrize("kw,match", [({"is_causal": 1}, "is_causal must be a bool"),
                                      ({"scale": float("nan")}, "finite float"), ({"scale": "0.1"}, "finite float")])
def test_attention_flag_types(kw, match):
    with pytest.raises(TypeError, match=match):
        ops.attention(q, kv, kv, **kw)


GOOD = [  # (id, calls, torch reference)
    ("gemm M=0", _gemm(a[:0], b), lambda: a[:0] @ b),
    ("gemm K=0 bias", _gemm(a[:, :0], b[:0], torch.ones(3)), lambda: torch.ones(6, 3)),
    ("gemm N=0", _gemm(a, b[:, :0]), lambda: a @ b[:, :0]),
    ("gemm odd K", _gemm(a7, b7), lambda: a7 @ b7),
    ("gemm bf16 -> f32", _gemm(a.bfloat16(), b.bfloat16(), None, torch.float32),
     lambda: a.bfloat16().float() @ b.bfloat16().float()),
    ("gemm transposed a", _gemm(a.t().contiguous().t(), b), lambda: a @ b),
    ("gemm nan", _gemm(torch.full((2, 5), float("nan")), b), lambda: torch.full((2, 3), float("nan"))),
    ("bmm B=0", _bmm(A[:0], B[:0]), lambda: torch.bmm(A[:0], B[:0])),
    ("bmm f16", _bmm(A.half(), B.half()), lambda: torch.bmm(A.half().float(), B.half().float()).half()),
    ("attention basic", _att(q, kv, kv), lambda: SDPA(q, kv, kv)),
    ("attention causal Sq<Skv", _att(q, kv, kv, True), lambda: SDPA(q, kv, kv, is_causal=True)),
    ("attention GQA", _att(q, kv2, kv2, gqa=True), lambda: SDPA(q, kv2, kv2, enable_gqa=True)),
    ("attention scale 0", _att(q, kv, kv, scale=0.0), lambda: SDPA(q, kv, kv, scale=0.0)),
    ("attention Sq=0", _att(q[:, :, :0], kv, kv), lambda: q[:, :, :0].clone()),
    ("attention Skv=0", _att(q, kv[:, :, :0], kv[:, :, :0]), lambda: torch.zeros_like(q)),
    ("attention D=0", _att(q[..., :0], kv[..., :0], kv[..., :0]), lambda: q[..., :0].clone()),
    ("attention H=0", _att(q[:, :0], kv[:, :0], kv[:, :0], gqa=True), lambda: q[:, :0].clone()),
    ("attention BSHD q", _att(q.transpose(1, 2).contiguous().transpose(1, 2), kv, kv),
     lambda: SDPA(q, kv, kv)),
    # a v head dim of its own (DeepSeek's MLA prefill: 192 / 128): the output takes v's
    ("attention Dv", _att(q, kv, kv[..., :8]), lambda: SDPA(q, kv, kv[..., :8])),
    ("attention Dv GQA causal", _att(q, kv2, v24, True, gqa=True),
     lambda: SDPA(q, kv2, v24, is_causal=True, enable_gqa=True)),
]


@pytest.mark.parametrize("calls,ref", [pytest.param(c, r, id=i) for i, c, r in GOOD])
def test_edge_inputs_match_torch(calls, ref):
    for name, call in calls:
        got = call()
        out = got[0] if isinstance(got, tuple) else got
        torch.testing.assert_close(out, ref(), atol=2e-2, rtol=2e-2, equal_nan=True, msg=name)
        if isinstance(got, tuple):
            assert got[1].shape == out.shape[:3] and got[1].dtype == torch.float32, name


def _opcheck_cases():
    g = torch.Generator().manual_seed(0)

    def r(*s, dtype=torch.float32):
        return torch.randn(*s, generator=g).to(dtype)

    cases = []
    for dt in (torch.float32, torch.float64, torch.bfloat16):
        cases += [(OPS.gemm, (r(7, 13, dtype=dt), r(13, 5, dtype=dt)), f"gemm odd {dt}"),
                  (OPS.gemm, (r(7, 13, dtype=dt), r(13, 5, dtype=dt), r(5, dtype=dt)), f"gemm bias {dt}"),
                  (OPS.bmm, (r(3, 7, 13, dtype=dt), r(3, 13, 5, dtype=dt)), f"bmm odd {dt}"),
                  (OPS.attention, (r(2, 4, 9, 16, dtype=dt), r(2, 2, 11, 16, dtype=dt), r(2, 2, 11, 16, dtype=dt),
                                   True, None, True), f"attention gqa causal {dt}")]
    cases += [(OPS.gemm, (r(0, 13), r(13, 5)), "gemm M=0"),
              (OPS.gemm, (r(4, 0), r(0, 5), r(5)), "gemm K=0 bias"),
              (OPS.gemm, (r(4, 6), r(6, 5), None, torch.float32), "gemm out_dtype"),
              (OPS.bmm, (r(0, 4, 6), r(0, 6, 5)), "bmm B=0"),
              (OPS.attention, (r(2, 4, 0, 16), r(2, 4, 12, 16), r(2, 4, 12, 16), False, None, False), "attention Sq=0"),
              (OPS.attention, (r(2, 4, 5, 16), r(2, 4, 0, 16), r(2, 4, 0, 16), False, None, False), "attention Skv=0"),
              (OPS.attention, (r(2, 4, 5, 0), r(2, 4, 6, 0), r(2, 4, 6, 0), False, None, False), "attention D=0"),
              (OPS.attention, (r(1, 3, 7, 12), r(1, 3, 5, 12), r(1, 3, 5, 12), True, -0.3, False),
               "attention odd causal Sq>Skv scale<0"),
              (OPS.attention, (r(2, 4, 9, 24), r(2, 2, 11, 24), r(2, 2, 11, 16), True, None, True),
               "attention Dv gqa causal")]
    return [pytest.param(op, args, id=name) for op, args, name in cases]


@pytest.mark.parametrize("op,args", _opcheck_cases())
@pytest.mark.parametrize("grad", [False, True])
def test_opcheck_every_custom_op(op, args, grad):
    if grad:
        args = tuple(x.requires_grad_() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in args)
    torch.library.opcheck(op.default, args)
