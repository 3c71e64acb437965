"""The random numerics sweep's pure parts: case generators, input builders, fp32 references, comparison.

test/gpu/test_sweep_gpu.py runs them on the H200; test/test_sweep_helpers.py checks them on CPU (there every
call falls back to torch). A case is drawn from ``random.Random(f"{family}/{seed}/{index}")``, so case i is
the same whatever the count, and a failure names family, index and seed: rerun it with
``TORCH_AUTOWS_SWEEP_SEED=<seed> TORCH_AUTOWS_SWEEP_N=<index + 1>``.

Sizes stay moderate and the flags that pick a compiled kernel (dtype, out dtype, operand layout, bias, causal,
raw_max by the sign of the scale, head dim) are drawn from a few coupled choices, so a sweep compiles about 30
kernels and most draws are launches: fp16 and fp32 output GEMMs keep row-major operands, non-positive
attention scales only with bf16, no sequence long enough for the 192-row attention configs. The attention
backward family (240 cases by default) draws only calls the generated backward serves and takes each kernel's
default config: its ~24 kernels are every (dtype, head dim, causal, form) the runtime compiles.
"""
from __future__ import annotations

import dataclasses
import math
import os
import random

import torch

N = int(os.environ.get("TORCH_AUTOWS_SWEEP_N", "500"))
#: The attention backward's count (issue 17: >= 200 configurations); TORCH_AUTOWS_SWEEP_N sets it too.
BWD_N = int(os.environ.get("TORCH_AUTOWS_SWEEP_N", "240"))
SEED = int(os.environ.get("TORCH_AUTOWS_SWEEP_SEED", "0"))
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
#: Relative norm error allowed, by the dtype of the output (the references are fp32 from the same inputs).
TOL = {torch.bfloat16: 1e-2, torch.float16: 1e-2, torch.float32: 2e-3}
#: log-sum-exp: |lse - ref| <= LSE_ATOL + LSE_RTOL * |ref| (test_attention_gpu's bounds).
LSE_ATOL, LSE_RTOL = 2e-2, 1e-3
#: Gradients (test_attention_bwd_gpu's rule): relative norm error <= max(2 x the vendor's own, BWD_FLOOR), plus
#: BWD_ATOL per element (a gradient that is zero in exact arithmetic comes out as rounding noise).
BWD_FLOOR, BWD_ATOL = 1e-2, 1e-4


@dataclasses.dataclass(frozen=True)
class Case:
    family: str
    seed: int
    index: int
    p: dict  # the drawn parameters

    def __getattr__(self, name):
        try:
            return self.__dict__["p"][name]
        except KeyError:
            raise AttributeError(name) from None

    def describe(self) -> str:
        args = " ".join(f"{k}={v}" for k, v in self.p.items() if k != "tseed")
        return (f"sweep {self.family} case {self.index} (seed {self.seed}; rerun with TORCH_AUTOWS_SWEEP_SEED="
                f"{self.seed} TORCH_AUTOWS_SWEEP_N={self.index + 1}): {args}")


def _rng(family: str, seed: int, i: int) -> random.Random:
    return random.Random(f"{family}/{seed}/{i}")


def _len(r: random.Random, hi: int, edges=(1, 2, 63, 64, 65, 127, 128, 129, 255, 256, 257)) -> int:
    x = r.random()
    if x < 0.25:
        return r.choice([e for e in edges if e <= hi])
    if x < 0.35:
        return r.randint(1, 16)
    return r.randint(1, hi)


def gemm_cases(n: int = N, seed: int = SEED) -> list[Case]:
    """ops.gemm draws: M 1..300 (decode-like small M often), odd N/K, bias, fp32 output, transposed operands,
    padded / tight / misaligned storage (tight odd K and misaligned views are refused: torch runs them)."""
    out = []
    for i in range(n):
        r = _rng("gemm", seed, i)
        dtype = r.choices(["bf16", "fp16", "fp32"], [75, 20, 5])[0]
        m, k = _len(r, 300), _len(r, 1024)
        nn = r.choices([8 * r.randint(1, 128), r.randint(1, 1024), r.choice([8, 16, 24, 128, 136, 256, 1024])],
                       [55, 15, 30])[0]
        if r.random() < 0.03:  # an empty dim: torch's answer (zeros, or the bias when K = 0)
            z = r.randrange(3)
            m, nn, k = (0 if j == z else d for j, d in enumerate((m, nn, k)))
        out32 = dtype != "fp32" and r.random() < 0.15
        row_major = dtype == "fp16" or out32  # fewer compiled variants (see the module doc)
        p = dict(m=m, n=nn, k=k, dtype=dtype, out32=out32, bias=r.random() < 0.35,
                 ta=not row_major and r.random() < 0.25, tb=not row_major and r.random() < 0.25,
                 storage=r.choices(["padded", "tight", "offset"], [72, 24, 4])[0], nonfinite=None,
                 tseed=r.getrandbits(62))
        if r.random() < 0.15:
            where = r.choice(["a", "b", "a", "b", "bias"] if p["bias"] else ["a", "b"])
            p["nonfinite"] = (where, r.choice(["nan", "inf", "-inf"]), r.random(), r.random())
        out.append(Case("gemm", seed, i, p))
    return out


def bmm_cases(n: int = N, seed: int = SEED) -> list[Case]:
    """ops.bmm draws: B 1..4; M a multiple of 128 and K of 64 (served) or not (torch), some non-row-major b."""
    out = []
    for i in range(n):
        r = _rng("bmm", seed, i)
        dtype = r.choices(["bf16", "fp16"], [75, 25])[0]
        tiled = r.random() < 0.75
        m = 128 * r.randint(1, 2) if tiled else _len(r, 300)
        k = 64 * r.randint(1, 8) if tiled else _len(r, 512)
        n_ = r.choices([8 * r.randint(1, 64), r.randint(1, 512)], [80, 20])[0]
        p = dict(b=r.randint(1, 4), m=m, n=n_, k=k, dtype=dtype,
                 out32=dtype == "bf16" and r.random() < 0.2, b_transposed=r.random() < 0.1, nonfinite=None,
                 tseed=r.getrandbits(62))
        if r.random() < 0.15:
            p["nonfinite"] = (r.choice(["a", "b"]), r.choice(["nan", "inf", "-inf"]), r.random(), r.random())
        out.append(Case("bmm", seed, i, p))
    return out


def attention_servable(p: dict) -> bool:
    """What runtime.attention.support_reason says for a drawn case on an sm_90 GPU (checked on CPU by
    test_sweep_helpers): half dtypes, head dim 64/96/128/192/256, non-empty sequences (every layout drawn is
    TMA-legal)."""
    return p["dtype"] in ("bf16", "fp16") and p["d"] in (64, 96, 128, 192, 256) and p["sq"] >= 1 and p["skv"] >= 1


def attention_cases(n: int = N, seed: int = SEED) -> list[Case]:
    """ops.attention draws: B 1..3, Hkv 1..4 with GQA groups 1/2/4, Sq != Skv with odd and block-edge lengths up
    to 1100, causal, d 64/96/128/192/256 (32, 80 fall back), bf16/fp16 (a few fp32: torch), default / positive /
    negative / zero scale, [B, S, H, D] views and fused-QKV slices. NaN inputs only where the generated kernel serves
    the call (torch's own fused kernels disagree among themselves on NaN rows) and in v only without causal (a
    causally skipped key block never multiplies v, a masked one in the diagonal block gives 0 * NaN)."""
    out = []
    for i in range(n):
        r = _rng("attention", seed, i)
        dtype = r.choices(["bf16", "fp16", "fp32"], [70, 25, 5])[0]
        hkv, g = r.randint(1, 4), r.choice([1, 1, 2, 4])
        edges = (1, 2, 63, 64, 65, 127, 128, 129, 191, 192, 193, 255, 256, 257, 383, 384, 385)
        sq, skv = (_len(r, 1100, edges) if r.random() < 0.2 else _len(r, 400, edges) for _ in range(2))
        if r.random() < 0.02:
            sq, skv = r.choice([(0, skv), (sq, 0)])
        scale = r.choices([None, round(r.uniform(0.02, 0.5), 4), -round(r.uniform(0.05, 0.3), 4), 0.0],
                          [50, 30, 12, 8])[0]
        if dtype == "fp16" and scale is not None and scale <= 0:
            scale = None  # non-positive scales (no raw_max) only with bf16: fewer compiled variants
        p = dict(b=r.randint(1, 3), hq=hkv * g, hkv=hkv, sq=sq, skv=skv, d=r.choices([64, 128, 32, 80, 96, 192, 256],
                 [42, 42, 3, 2, 4, 4, 3])[0], dtype=dtype, causal=r.random() < 0.5, scale=scale,
                 gqa_flag=g > 1 or r.random() < 0.1, q_layout=r.choices(["bhsd", "bshd", "fused"], [60, 30, 10])[0],
                 kv_layout=r.choices(["bhsd", "bshd", "fused"], [60, 30, 10])[0], out_bshd=r.random() < 0.3,
                 nonfinite=None, tseed=r.getrandbits(62))
        if attention_servable(p) and r.random() < 0.15:
            where = r.choice(["q", "k"] if p["causal"] else ["q", "k", "v"])
            p["nonfinite"] = (where, "nan", r.random(), r.random())
        out.append(Case("attention", seed, i, p))
    return out


def attention_bwd_cases(n: int = BWD_N, seed: int = SEED) -> list[Case]:
    """runtime.attention_bwd draws, every one served on sm_90: d 64/128, bf16/fp16, B 1..3, Hkv 1..4 with GQA groups
    1/2/4/8, Sq = Skv or not with block-edge and odd lengths up to 1100, causal, default or positive scale,
    q / kv / dO / out each [B, H, S, D] or a [B, S, H, D] view, a gradient into lse in ~30% (always when there is
    none into out, ~10%), dQ by atomic adds, TMA reduce-adds or the separate kernel (``dq_mode``)."""
    out = []
    edges = (1, 2, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257, 383, 384, 385)
    for i in range(n):
        r = _rng("attention_bwd", seed, i)
        hkv, g = r.randint(1, 4), r.choice([1, 2, 4, 8])
        sq, skv = (_len(r, 1100, edges) if r.random() < 0.25 else _len(r, 400, edges) for _ in range(2))
        skv = sq if r.random() < 0.3 else skv  # self-attention (the only causal shape cuDNN's backward takes)
        dout = r.random() >= 0.1
        p = dict(b=r.randint(1, 3), hq=hkv * g, hkv=hkv, sq=sq, skv=skv, d=r.choice([64, 128]),
                 dtype=r.choices(["bf16", "fp16"], [60, 40])[0], causal=r.random() < 0.5,
                 scale=r.choices([None, round(r.uniform(0.03, 0.3), 4)], [70, 30])[0],
                 **{f"{t}_layout": r.choices(["bhsd", "bshd"], [65, 35])[0] for t in ("q", "kv", "do", "out")},
                 dout=dout, dlse=not dout or r.random() < 0.25,
                 dq_mode=r.choice(["atomic", "reduce", "separate"]), nonfinite=None, tseed=r.getrandbits(62))
        out.append(Case("attention_bwd", seed, i, p))
    return out


# ---------------------------------------------------------------------------------------------- inputs


def _gen(case: Case, device) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(case.tseed)


def _randn(*shape, gen, device, dtype, fill: bool = True) -> torch.Tensor:
    """Normal values, or (``fill=False``: only the layout matters, as for the support checks) uninitialised."""
    if not fill:
        return torch.empty(shape, device=device, dtype=dtype)
    return torch.randn(shape, generator=gen, device=device, dtype=torch.float32).to(dtype)


def _matrix(rows, cols, dtype, trans: bool, storage: str, gen, device, fill=True) -> torch.Tensor:
    """A [rows, cols] operand: row-major, or a transposed view of a [cols, rows] one; ``storage`` padded (row pitch
    a multiple of 8 elements: TMA-legal), tight (contiguous: legal only where the pitch is) or offset (starts
    one element in: not 16-byte aligned)."""
    r, c = (cols, rows) if trans else (rows, cols)
    pitch = c + (-c) % 8 if storage == "padded" else c + (storage == "offset")
    start = 1 if storage == "offset" else 0
    t = _randn(r, pitch, gen=gen, device=device, dtype=dtype, fill=fill)[:, start:start + c]
    return t.t() if trans else t


def _inject(t: torch.Tensor, kind: str, f0: float, f1: float) -> None:
    """Write NaN / +-inf at one element chosen by the fractions f0, f1 of the first and last dims (others: 0)."""
    if t.numel() == 0:
        return
    idx = [0] * t.dim()
    idx[0], idx[-1] = int(f0 * t.shape[0]), int(f1 * t.shape[-1])
    t[tuple(idx)] = float(kind)


def gemm_inputs(case: Case, device="cpu", fill: bool = True):
    """(a, b, bias, out_dtype) of a gemm case."""
    gen, dt = _gen(case, device), DTYPES[case.dtype]
    a = _matrix(case.m, case.k, dt, case.ta, case.storage, gen, device, fill)
    b = _matrix(case.k, case.n, dt, case.tb, "padded" if case.storage == "offset" else case.storage, gen, device,
                fill)
    bias = _randn(case.n, gen=gen, device=device, dtype=dt, fill=fill) if case.bias else None
    if case.nonfinite and fill:
        where, kind, f0, f1 = case.nonfinite
        _inject({"a": a, "b": b, "bias": bias}[where], kind, f0, f1)
    return a, b, bias, torch.float32 if case.out32 else dt


def bmm_inputs(case: Case, device="cpu", fill: bool = True):
    """(a, b, out_dtype) of a bmm case."""
    gen, dt = _gen(case, device), DTYPES[case.dtype]
    a = _randn(case.b, case.m, case.k, gen=gen, device=device, dtype=dt, fill=fill)
    if case.b_transposed:
        b = _randn(case.b, case.n, case.k, gen=gen, device=device, dtype=dt, fill=fill).transpose(1, 2)
    else:
        b = _randn(case.b, case.k, case.n, gen=gen, device=device, dtype=dt, fill=fill)
    if case.nonfinite and fill:
        where, kind, f0, f1 = case.nonfinite
        _inject(a if where == "a" else b, kind, f0, f1)
    return a, b, torch.float32 if case.out32 else dt


def _heads(b, h, s, d, layout, dt, gen, device, fill) -> torch.Tensor:
    kw = dict(gen=gen, device=device, dtype=dt, fill=fill)
    if layout == "fused":  # one of q/k/v sliced from a fused [B, S, 3, H, D] projection: rows 3*H*D apart
        return _randn(b, s, 3, h, d, **kw).permute(2, 0, 3, 1, 4)[1]
    if layout == "bshd":  # [B, S, H, D] as models produce it, viewed as [B, H, S, D]
        return _randn(b, s, h, d, **kw).transpose(1, 2)
    return _randn(b, h, s, d, **kw)


def attention_inputs(case: Case, device="cpu", fill: bool = True):
    """(q, k, v, scale for the kernel) of an attention case."""
    gen, dt = _gen(case, device), DTYPES[case.dtype]
    q = _heads(case.b, case.hq, case.sq, case.d, case.q_layout, dt, gen, device, fill)
    k = _heads(case.b, case.hkv, case.skv, case.d, case.kv_layout, dt, gen, device, fill)
    v = _heads(case.b, case.hkv, case.skv, case.d, case.kv_layout, dt, gen, device, fill)
    if case.nonfinite and fill:
        where, kind, f0, f1 = case.nonfinite
        t = {"q": q, "k": k, "v": v}[where]
        with torch.no_grad():  # one element of a random (batch, head, position)
            t[int(f0 * t.shape[0]), int(f1 * t.shape[1]), int(f0 * f1 * 997) % t.shape[2], int(f1 * t.shape[3])] \
                = float(kind)
    return q, k, v, case.scale if case.scale is not None else 1.0 / math.sqrt(case.d)


def attention_bwd_inputs(case: Case, device="cpu", fill: bool = True):
    """(grad_out or None, grad_lse or None, q, k, v, out, lse, scale) of an attention backward case. out and lse are
    the fp32 reference forward's (``attention_reference``; out rounded to the dtype): the backward is checked on its
    own, whatever the generated forward gives (the forward sweep checks that)."""
    gen, dt = _gen(case, device), DTYPES[case.dtype]
    q = _heads(case.b, case.hq, case.sq, case.d, case.q_layout, dt, gen, device, fill)
    k = _heads(case.b, case.hkv, case.skv, case.d, case.kv_layout, dt, gen, device, fill)
    v = _heads(case.b, case.hkv, case.skv, case.d, case.kv_layout, dt, gen, device, fill)
    do = _heads(case.b, case.hq, case.sq, case.d, case.do_layout, dt, gen, device, fill) if case.dout else None
    dlse = _randn(case.b, case.hq, case.sq, gen=gen, device=device, dtype=torch.float32, fill=fill) \
        if case.dlse else None
    scale = case.scale if case.scale is not None else 1.0 / math.sqrt(case.d)
    out = _heads(case.b, case.hq, case.sq, case.d, case.out_layout, dt, gen, device, fill=False)
    lse = torch.empty(case.b, case.hq, case.sq, device=device)
    if fill:
        ref, ref_lse = attention_reference(q, k, v, case.causal, scale)
        out.copy_(ref)
        lse.copy_(ref_lse)
    return do, dlse, q, k, v, out, lse, scale


def poisoned(shape, dtype, device, bshd: bool = False) -> torch.Tensor:
    """An out= tensor full of NaN (a [B, H, S, D] ``bshd`` one is a transposed [B, S, H, D] allocation)."""
    if bshd:
        b, h, s, d = shape
        return torch.full((b, s, h, d), float("nan"), dtype=dtype, device=device).transpose(1, 2)
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


# ---------------------------------------------------------------------------------------------- references


def gemm_reference(a, b, bias=None) -> torch.Tensor:
    """fp32 ``a @ b (+ bias)`` (batched when 3-D)."""
    out = torch.matmul(a.float(), b.float())
    return out + bias.float() if bias is not None else out


def attention_reference(q, k, v, is_causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 explicit softmax attention, torch's semantics (top-left causal, GQA by head groups): (out, lse).
    NaN stays NaN (a row with a NaN score is NaN, as the explicit softmax and SDPA's math backend give)."""
    hq, hkv = q.shape[1], k.shape[1]
    if hkv and hq != hkv:
        k, v = k.repeat_interleave(hq // hkv, dim=1), v.repeat_interleave(hq // hkv, dim=1)
    s = torch.matmul(q.float(), k.float().transpose(-2, -1)) * scale
    if is_causal:
        keep = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    return torch.matmul(torch.softmax(s, dim=-1), v.float()), torch.logsumexp(s, dim=-1)


def attention_bwd_reference(grad_out, grad_lse, q, k, v, out, lse, is_causal: bool, scale: float):
    """fp32 (dq, dk, dv): attention_grad's math backward on fp32 copies, k/v expanded to q's heads and the gradients
    summed back per group (what test_attention_bwd_gpu compares against). grad_out or grad_lse may be None."""
    from torch_autows import attention_grad as ag

    f = lambda t: None if t is None else t.float()
    g = ag._group(q, k)
    dq, dk, dv = ag._math_backward(f(grad_out), f(grad_lse), f(q), ag._expand_kv(f(k), g), ag._expand_kv(f(v), g),
                                   f(out), f(lse), is_causal, scale)
    return dq, ag._reduce_kv(dk, g), ag._reduce_kv(dv, g)


# ---------------------------------------------------------------------------------------------- comparison


def _where(mask: torch.Tensor) -> str:
    idx = mask.nonzero()
    return f"{len(idx)} elements, first at {tuple(idx[0].tolist())}" if len(idx) else "none"


def compare(out, ref, tol: float, *, name: str = "out", dtype=None, atol: float | None = None) -> str | None:
    """None if ``out`` matches the fp32 ``ref``; else what differs. NaN, +inf and -inf must sit exactly where the
    reference (rounded to ``out``'s dtype) has them; the finite rest within a relative norm error ``tol``, or
    elementwise within ``atol + tol * |ref|`` when ``atol`` is given."""
    if not isinstance(out, torch.Tensor):
        return f"{name} is {type(out).__name__}, not a tensor"
    if tuple(out.shape) != tuple(ref.shape) or (dtype is not None and out.dtype != dtype):
        return f"{name} is {out.dtype}{list(out.shape)}, expected {dtype or out.dtype}{list(ref.shape)}"
    o, rr = out.float(), ref.to(out.dtype).float()
    for what, f in (("NaN", torch.isnan), ("+inf", lambda x: x == math.inf), ("-inf", lambda x: x == -math.inf)):
        extra, missing = f(o) & ~f(rr), f(rr) & ~f(o)
        if extra.any() or missing.any():
            return (f"{name}: {what} pattern differs from the reference: unexpected at {_where(extra)}; "
                    f"missing at {_where(missing)}")
    fin = torch.isfinite(rr)
    o, r = o[fin], ref.float()[fin]
    if atol is not None:
        bad = (o - r).abs() > atol + tol * r.abs()
        if bad.any():
            i = int(bad.nonzero()[0])
            return f"{name}: {int(bad.sum())} elements off by more than {atol} + {tol}*|ref|, e.g. {o[i]} vs {r[i]}"
        return None
    err = ((o - r).norm() / r.norm().clamp_min(1e-6)).item() if o.numel() else 0.0
    return None if err <= tol else f"{name}: relative norm error {err:.3g} > {tol}"


def _rel(x, ref) -> float:
    return ((x.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-6)).item()


def compare_grads(got, ref, vendor, like, *, name: str) -> list[str]:
    """What is wrong with ``got`` = (dq, dk, dv) against the fp32 ``ref``: each of ``like``'s (q, k, v) shape and
    dtype, finite (the inputs are: a NaN is a row the kernel did not write or one it computed), exactly zero where
    ``ref`` is, else a norm error <= max(2 x the ``vendor`` gradient's, BWD_FLOOR) x |ref| + BWD_ATOL x sqrt(size)."""
    fails = []
    if not isinstance(got, (tuple, list)) or len(got) != 3:
        return [f"{name} returned {type(got).__name__}, not (dq, dk, dv)"]
    for g, x, r, w, t in zip(("dq", "dk", "dv"), got, ref, vendor, like):
        what = f"{name} {g}"
        if not isinstance(x, torch.Tensor) or tuple(x.shape) != tuple(t.shape) or x.dtype != t.dtype:
            desc = f"{x.dtype}{list(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
            fails.append(f"{what} is {desc}, expected {t.dtype}{list(t.shape)}")
        elif not torch.isfinite(x).all():
            fails.append(f"{what}: non-finite at {_where(~torch.isfinite(x))} (finite inputs)")
        elif r.norm() == 0:  # dV with no gradient into out
            if x.abs().max().item() != 0:
                fails.append(f"{what}: nonzero (max {x.float().abs().max().item():.3g}) where the gradient is 0")
        else:
            tol = max(2 * _rel(w, r), BWD_FLOOR)
            if (x.float() - r.float()).norm().item() > tol * r.float().norm().item() + BWD_ATOL * x.numel() ** 0.5:
                fails.append(f"{what}: relative norm error {_rel(x, r):.3g} > {tol:.3g} (2 x the vendor's "
                             f"{_rel(w, r):.3g}, at least {BWD_FLOOR}) + {BWD_ATOL} per element")
    return fails


# ---------------------------------------------------------------------------------------------- one case


def run_gemm(case: Case, device) -> tuple[list[str], bool]:
    """(what failed, whether the generated kernel can serve it): ops.gemm, and where the runtime serves the call
    also the runtime with a NaN-poisoned out= (an element the kernel does not write stays NaN)."""
    from torch_autows import ops
    from torch_autows.runtime import gemm as rt

    a, b, bias, odt = gemm_inputs(case, device)
    ref = gemm_reference(a, b, bias)
    fails = [compare(ops.gemm(a, b, bias, out_dtype=odt if case.out32 else None), ref, TOL[odt], dtype=odt,
                     name="ops.gemm")]
    served = rt.support_reason(a, b, bias, odt) is None
    if served:
        c = poisoned((case.m, case.n), odt, device)
        rt.gemm(a, b, bias, odt, config="auto", out=c)
        fails.append(compare(c, ref, TOL[odt], dtype=odt, name="runtime gemm into a NaN out="))
    return [f for f in fails if f], served


def run_bmm(case: Case, device) -> tuple[list[str], bool]:
    """As ``run_gemm``, for ops.bmm."""
    from torch_autows import ops
    from torch_autows.runtime import gemm as rt

    a, b, odt = bmm_inputs(case, device)
    ref = gemm_reference(a, b)
    fails = [compare(ops.bmm(a, b, out_dtype=odt if case.out32 else None), ref, TOL[odt], dtype=odt,
                     name="ops.bmm")]
    served = rt.support_reason(a, b, None, odt) is None
    if served:
        c = poisoned((case.b, case.m, case.n), odt, device)
        rt.bmm(a, b, odt, config="auto", out=c)
        fails.append(compare(c, ref, TOL[odt], dtype=odt, name="runtime bmm into a NaN out="))
    return [f for f in fails if f], served


def run_attention(case: Case, device) -> tuple[list[str], bool]:
    """As ``run_gemm``, for ops.attention: out and lse, the runtime's into NaN-poisoned out= and lse=."""
    from torch_autows import ops
    from torch_autows.runtime import attention as rt

    q, k, v, scale = attention_inputs(case, device)
    ref, ref_lse = attention_reference(q, k, v, case.causal, scale)
    odt = DTYPES[case.dtype]

    def check(out, lse, how):
        return [compare(out, ref, TOL[odt], dtype=odt, name=f"{how} out"),
                compare(lse, ref_lse, LSE_RTOL, atol=LSE_ATOL, dtype=torch.float32, name=f"{how} lse")]

    fails = check(*ops.attention(q, k, v, is_causal=case.causal, scale=case.scale, enable_gqa=case.gqa_flag),
                  "ops.attention")
    served = rt.support_reason(q, k, v, case.causal, scale) is None
    if served:
        out = poisoned((case.b, case.hq, case.sq, case.d), odt, device, case.out_bshd)
        lse = poisoned((case.b, case.hq, case.sq), torch.float32, device)
        rt.attention(q, k, v, case.causal, scale, config="auto", out=out, lse=lse)
        fails += check(out, lse, "runtime attention into NaN out=/lse=")
    return [f for f in fails if f], served


def run_attention_bwd(case: Case, device) -> tuple[list[str], bool]:
    """(what failed, whether the generated backward serves it): attention_grad.attention_backward with
    ``config.attention_backward = "autows"`` (the form chosen per call), and where the runtime serves the call
    ``runtime.attention_bwd.backward`` in the case's ``dq_mode`` with ``POISON`` = NaN (dK/dV, and the separate
    form's dQ, filled with NaN before the launch: an element the kernel does not write shows). Both against the fp32
    reference with the vendor's gradients (``vendor_backward``) on the same inputs setting the tolerance."""
    from torch_autows import attention_grad as ag
    from torch_autows import config
    from torch_autows.runtime import attention_bwd as rt

    args = attention_bwd_inputs(case, device)
    go, _, q, k, v, out, lse, scale = args
    ref, vendor = attention_bwd_reference(*args[:-1], case.causal, scale), ag.vendor_backward(*args[:-1],
                                                                                              case.causal, scale)
    with config.patch(attention_backward="autows"):
        fails = compare_grads(ag.attention_backward(*args[:-1], case.causal, scale), ref, vendor, (q, k, v),
                              name="attention_backward")
    served = rt.support_reason(q, k, v, out, lse, go, case.causal, scale) is None
    if served:
        poison, rt.POISON = rt.POISON, float("nan")
        try:
            got = rt.backward(*args[:-1], case.causal, scale, dq_mode=case.dq_mode)
        finally:
            rt.POISON = poison
        fails += compare_grads(got, ref, vendor, (q, k, v), name=f"runtime backward ({case.dq_mode} dQ, NaN-poisoned)")
    return fails, served


RUNNERS = {"gemm": (gemm_cases, run_gemm), "bmm": (bmm_cases, run_bmm), "attention": (attention_cases, run_attention),
           "attention_bwd": (attention_bwd_cases, run_attention_bwd)}


def shard(cases: list[Case], spec: str | None) -> list[Case]:
    """The cases of shard ``spec`` ("i/n", TORCH_AUTOWS_SWEEP_SHARD; None: all), so that n processes on one GPU share
    the cases evenly and compile few kernels each: the cases are grouped by head dim (kernels are compiled per head
    dim; families without one form one group), each group cut into chunks of at most len(cases) / n, and the chunks
    dealt largest first to the shard with the fewest cases."""
    if not spec:
        return cases
    i, n = (int(x) for x in spec.split("/"))
    if not 0 <= i < n:
        raise ValueError(f"TORCH_AUTOWS_SWEEP_SHARD={spec!r}; use i/n with 0 <= i < n")
    groups: dict = {}
    for c in cases:
        groups.setdefault(c.p.get("d"), []).append(c)
    size = max(1, math.ceil(len(cases) / n))
    chunks = [g[k:k + size] for g in groups.values() for k in range(0, len(g), size)]
    shards: list[list[Case]] = [[] for _ in range(n)]
    for chunk in sorted(chunks, key=len, reverse=True):
        min(shards, key=len).extend(chunk)
    return sorted(shards[i], key=lambda c: c.index)


def sweep(family: str, n: int | None = None, seed: int = SEED, device="cuda", cases=None) -> tuple[list[str], str]:
    """Run ``n`` cases of one family (None: its default count, N or BWD_N), or ``cases``: (failure messages, each
    naming its case and seed; the summary line)."""
    make, run = RUNNERS[family]
    cases = cases if cases is not None else make(seed=seed) if n is None else make(n, seed)
    cases = shard(cases, os.environ.get("TORCH_AUTOWS_SWEEP_SHARD"))
    failures, served, nonfinite = [], 0, 0
    for case in cases:
        try:
            fails, ok = run(case, device)
        except Exception as e:  # a crash is a failure of this case; the sweep goes on
            fails, ok = [f"raised {type(e).__name__}: {e}"], False
        served += ok
        nonfinite += case.nonfinite is not None
        failures += [f"{case.describe()}\n    {f}" for f in fails]
    bad = len({f.split("\n")[0] for f in failures})
    line = (f"sweep {family}: {len(cases)} configs, {bad} failures (seed {seed}; {served} servable by the generated "
            f"kernel, {len(cases) - served} by torch; {nonfinite} with NaN/inf inputs)")
    return failures, line
