"""Numerics of the generated flash-attention forward on sm_90 against fp32 math SDPA: >= 200 configurations.

Sequence lengths with tails (1, 17, 1000, 4097) and in whole query tiles (128, 384: O stored by TMA), Sq != Skv,
causal (top-left, as torch), GQA, bf16 and fp16, head dims 64/128 (and 60 cases of 96/192/256), [B, S, H, D] views
transposed to [B, H, S, D] (q/v and k independently, so k and v may differ in layout; at odd lengths sliced from a
fused QKV projection, rows 3*H*D apart), every runtime config in turn; out and lse both checked; outputs poisoned
with NaN before each run.
"""
from __future__ import annotations

import math
import random

import pytest
import torch

from torch_autows.ops import torch_attention
from torch_autows.runtime import attention as rt
from torch_autows.runtime import fallback


def _cases(n=220, seed=1, dims=(64, 128)):
    rng = random.Random(seed)
    seqs = [1, 17, 64, 127, 128, 129, 300, 384, 1000, 4097]  # 128 and 384: whole tiles, O by TMA store (o_tma)
    out = []
    for i in range(n):
        hkv = rng.choice([1, 2, 4])
        out.append(dict(b=rng.choice([1, 2]), hkv=hkv, g=rng.choice([1, 2, 4]), sq=rng.choice(seqs),
                        skv=rng.choice(seqs), d=rng.choice(dims), causal=rng.random() < 0.5,
                        dtype=rng.choice([torch.bfloat16, torch.float16]), bshd=rng.random() < 0.25,
                        kv_bshd=rng.random() < 0.25, scale=rng.choice([None, 0.3, 0.0, -0.3])))
        configs = [n for n in rt.CONFIGS if rt.serves(n, out[-1]["d"], causal=out[-1]["causal"])]  # each in turn
        out[-1]["config"] = configs[i % len(configs)]
    return out


def _id(c):
    return (f"b{c['b']}h{c['hkv'] * c['g']}/{c['hkv']}-q{c['sq']}-kv{c['skv']}-d{c['d']}{'-causal' * c['causal']}"
            f"-{c['config']}")


@pytest.mark.parametrize("c", _cases() + _cases(60, seed=2, dims=(96, 192, 256)), ids=_id)
def test_attention_random(c):
    torch.manual_seed(hash(str(c)) % 2**31)
    hq = c["hkv"] * c["g"]

    def mk(h, s, bshd):
        if bshd and s % 2:  # odd lengths: sliced from a fused [B, S, 3, H, D] projection (rows 3*H*D apart)
            return torch.randn(c["b"], s, 3, h, c["d"], device="cuda", dtype=c["dtype"]).permute(2, 0, 3, 1, 4)[1]
        if bshd:  # as models produce them: [B, S, H, D] viewed as [B, H, S, D]
            return torch.randn(c["b"], s, h, c["d"], device="cuda", dtype=c["dtype"]).transpose(1, 2)
        return torch.randn(c["b"], h, s, c["d"], device="cuda", dtype=c["dtype"])

    q, k, v = mk(hq, c["sq"], c["bshd"]), mk(c["hkv"], c["skv"], c["kv_bshd"]), mk(c["hkv"], c["skv"], c["bshd"])
    scale = c["scale"] if c["scale"] is not None else 1 / math.sqrt(c["d"])
    # out= in either layout (drawn with k's flag, independent of q's); out=None is q's layout (below)
    out = torch.full((c["b"], c["sq"], hq, c["d"]) if c["kv_bshd"] else (c["b"], hq, c["sq"], c["d"]), float("nan"),
                     device="cuda", dtype=c["dtype"])
    out = out.transpose(1, 2) if c["kv_bshd"] else out
    lse = torch.full((c["b"], hq, c["sq"]), float("nan"), device="cuda")
    rt.attention(q, k, v, c["causal"], scale, config=c["config"], out=out, lse=lse)
    ref, ref_lse = torch_attention(q.float(), k.float(), v.float(), c["causal"], scale)
    torch.cuda.synchronize()
    assert not out.isnan().any() and not lse.isnan().any()
    err = ((out.float() - ref).norm() / ref.norm().clamp_min(1e-6)).item()
    assert err < 1e-2, err
    torch.testing.assert_close(lse, ref_lse, atol=2e-2, rtol=1e-3)


@pytest.mark.parametrize("config", [n for n in rt.CONFIGS if rt.CONFIGS[n].cross_tile])
@pytest.mark.parametrize("d,causal,sq,skv", [(128, True, 1000, 1000), (128, False, 513, 777), (64, True, 4097, 4097),
                                              (64, False, 129, 1)])
def test_cross_tile_many_tiles_per_cta(config, d, causal, sq, skv):
    """passes/cross_tile: b=4, h=48 puts 3-34 tiles on each persistent CTA (grid = SMs), so every CTA runs the
    peeled first tile, next-tile steps and the last tail; ragged lengths, out and lse checked."""
    if not rt.serves(config, d, causal=causal):
        pytest.skip(f"{config} serves head dims {rt.HEAD_DIMS.get(config)}")
    torch.manual_seed(0)
    q = torch.randn(4, 48, sq, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(4, 48, skv, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    out = torch.full_like(q, float("nan"))
    lse = torch.full((4, 48, sq), float("nan"), device="cuda")
    rt.attention(q, k, v, causal, 1 / math.sqrt(d), config=config, out=out, lse=lse)
    ref, ref_lse = torch_attention(q.float(), k.float(), v.float(), causal, 1 / math.sqrt(d))
    torch.cuda.synchronize()
    assert not out.isnan().any() and not lse.isnan().any()
    assert ((out.float() - ref).norm() / ref.norm().clamp_min(1e-6)).item() < 1e-2
    torch.testing.assert_close(lse, ref_lse, atol=2e-2, rtol=1e-3)


def test_ops_attention_served():
    fallback.reset()
    import torch_autows

    q = torch.randn(2, 8, 256, 128, device="cuda", dtype=torch.bfloat16)
    out, lse = torch_autows.ops.attention(q, q, q, is_causal=True)
    assert fallback.counters["attention.autows"] == 1
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), q.float(), q.float(), is_causal=True)
    assert ((out.float() - ref).norm() / ref.norm()).item() < 1e-2
    qt = q.transpose(1, 2).contiguous().transpose(1, 2)  # [B, S, H, D] as models produce it
    out_t, _ = torch_autows.ops.attention(qt, qt, qt, is_causal=True)
    assert out_t.transpose(1, 2).is_contiguous()  # written in q's layout: the transpose back is a view
    torch.testing.assert_close(out_t, out)


@pytest.mark.parametrize("d", [96, 192, 256])
def test_ops_attention_serves_wide_head_dims(d):
    """96 and 192 run in tiles of 128 and 256 columns: q/k/v in [B, S, H, D] with several heads are read from
    [B, H, S, D] copies (the padding columns must be zeros, not the next head's), out stays in q's layout."""
    fallback.reset()
    import torch_autows

    q, k, v = (torch.randn(2, 300, 4, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2) for _ in range(3))
    k = k * 3  # a next head's columns in place of zeros would change the scores visibly
    for causal in (False, True):
        out, lse = torch_autows.ops.attention(q, k, v, is_causal=causal)  # ours: the tests force choice "autows"
        ref, ref_lse = torch_attention(q.float(), k.float(), v.float(), causal, d ** -0.5)
        assert not out.isnan().any() and out.transpose(1, 2).is_contiguous()
        assert ((out.float() - ref).norm() / ref.norm()).item() < 1e-2
        torch.testing.assert_close(lse, ref_lse, atol=2e-2, rtol=1e-3)
    assert fallback.counters["attention.autows"] == 2


def test_head_dim_80_falls_back_with_reason(caplog):
    fallback.reset()
    import torch_autows

    q = torch.randn(1, 2, 64, 80, device="cuda", dtype=torch.bfloat16)
    with caplog.at_level("WARNING", logger="torch_autows"):
        torch_autows.ops.attention(q, q, q)
    assert "head_dim 80" in caplog.text and fallback.counters["attention.fallback"] == 1


def _mla_cases(n=40, seed=3):
    """q/k of head dim 192 and v of 128 (DeepSeek's MLA prefill), every config runtime.attention lists for the pair."""
    rng = random.Random(seed)
    seqs = [1, 17, 127, 128, 300, 384, 1000, 4097]
    configs = rt.V_HEAD_DIMS[(192, 128)]
    return [dict(b=rng.choice([1, 2]), hkv=rng.choice([1, 2, 4]), g=rng.choice([1, 2]), sq=rng.choice(seqs),
                 skv=rng.choice(seqs), causal=rng.random() < 0.5, dtype=rng.choice([torch.bfloat16, torch.float16]),
                 bshd=rng.random() < 0.3, kv_bshd=rng.random() < 0.3, scale=rng.choice([None, 0.3, -0.3]),
                 config=configs[i % len(configs)]) for i in range(n)]


@pytest.mark.parametrize("c", _mla_cases(), ids=lambda c: _id({**c, "d": "192v128"}))
def test_attention_v_head_dim_of_its_own(c):
    torch.manual_seed(hash(str(c)) % 2**31)
    hq = c["hkv"] * c["g"]

    def mk(h, s, d, bshd):
        if bshd:
            return torch.randn(c["b"], s, h, d, device="cuda", dtype=c["dtype"]).transpose(1, 2)
        return torch.randn(c["b"], h, s, d, device="cuda", dtype=c["dtype"])

    q, k = mk(hq, c["sq"], 192, c["bshd"]), mk(c["hkv"], c["skv"], 192, c["kv_bshd"])
    v = mk(c["hkv"], c["skv"], 128, c["kv_bshd"])
    scale = c["scale"] if c["scale"] is not None else 192 ** -0.5
    out = torch.full((c["b"], hq, c["sq"], 128), float("nan"), device="cuda", dtype=c["dtype"])
    lse = torch.full((c["b"], hq, c["sq"]), float("nan"), device="cuda")
    rt.attention(q, k, v, c["causal"], scale, config=c["config"], out=out, lse=lse)
    ref, ref_lse = torch_attention(q.float(), k.float(), v.float(), c["causal"], scale)
    torch.cuda.synchronize()
    assert not out.isnan().any() and not lse.isnan().any()
    assert ((out.float() - ref).norm() / ref.norm().clamp_min(1e-6)).item() < 1e-2
    torch.testing.assert_close(lse, ref_lse, atol=2e-2, rtol=1e-3)


def test_attention_v_head_dim_through_the_op_and_autograd():
    """ops.attention serves 192 / 128 with the generated kernel (counted), and its gradients (the vendor's backward:
    here the math, as flash and cuDNN take one head dim) match fp32 autograd."""
    from torch_autows import ops

    fallback.reset()
    q, k = (torch.randn(2, 8, 1000, 192, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    v = torch.randn(2, 8, 1000, 128, device="cuda", dtype=torch.bfloat16)
    out, lse = ops.attention(q, k, v, is_causal=True)
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    assert out.shape == (2, 8, 1000, 128) and fallback.counters["attention.autows"] >= 1
    assert ((out.float() - ref).norm() / ref.norm()).item() < 1e-2
    qs, ks, vs = (t.detach().clone().requires_grad_() for t in (q, k, v))
    o, _ = ops.attention(qs, ks, vs, is_causal=True)
    g = torch.randn_like(o)
    o.backward(g)
    qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
    torch.nn.functional.scaled_dot_product_attention(qf, kf, vf, is_causal=True).backward(g.float())
    for got, want in ((qs.grad, qf.grad), (ks.grad, kf.grad), (vs.grad, vf.grad)):
        assert ((got.float() - want).norm() / want.norm()).item() < 2e-2
