"""Random small instances with torch references, for ``interpret_report`` and the tests.

``make_instance(program, seed)`` picks a small problem for a Program from its tile sizes and builds
its inputs (as they lie in memory), poisoned outputs (NaN, so a tile never stored shows up) and the
torch reference. GEMM: a few output tiles (at least three, so a persistent CTA walks two), ragged
tails in M, N and K, at least one more K step than the ring has slots (the ring wraps); values are
multiples of 1/4 in [-1, 1], exact in bf16/fp16 with exact fp32 products and sums, so every correct
schedule is bit-identical to torch. A swiglu GEMM (arg ``bu``, the up weight laid out as ``b``) has the
reference ``silu(A @ B) * (A @ Bu)`` in fp32 (the interpreter's silu is torch's, on the same exact sums); saving its
projections (out args ``g``, ``u``: epilogue "swiglu_save") adds their references, each sum rounded once. A residual
GEMM (arg ``r``, [batch*M, N] like c) adds R in fp32 after the bias, before the one rounding to c's dtype. An
activation GEMM (a ``gelu`` op) applies torch's F.gelu (same ``approximate``) to the fp32 biased sum. A RoPE GEMM
(args ``cos``, ``sin`` [P, D], a ``rotate_half`` op of width D) has N a multiple of D, a random period P and the
reference ``x * cos[m % P, n % D] + rotate_half(x) * sin[m % P, n % D]`` on the fp32 biased sum (quarter-valued
tables: still exact); with the tables read by TMA (``Options.epilogue_tma``) P is a multiple of the tile's rows or
at least M, as the runtime requires (runtime.gemm_rope.tables_options). A SwiGLU-backward GEMM (out arg ``du``, args
``g``, ``u`` [M, N]) has the references ``dG = dh * U * silu'(G)`` (c) and ``du = dh * silu(G)`` in fp32, dh = A @ B.
Attention: random heads (GQA groups 1 or 2), ragged Sq and Skv, q and k/v each [B, H, S, D] or [B, S, H, D]
in memory, causal or not, normal values, compared with an fp32 softmax reference within bf16/fp16 tolerances."""
from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from ..ir import Program, walk
from .ops import TORCH_DTYPE, InterpError, rotate_half, silu_grad

TOL = {"bf16": 1e-2, "fp16": 1e-3, "f32": 1e-5, "fp32": 1e-5}


def _copy(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` with its shape and strides (the elements between its rows are uninitialised)."""
    out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
    return out.copy_(t)


@dataclass
class Instance:
    desc: str
    tensors: dict  # inputs as they lie in memory; out tensors poisoned with NaN
    scalars: dict
    reference: dict  # out arg -> expected tensor
    tol: dict  # out arg -> rtol = atol for ``matches``

    def inputs(self) -> dict:
        """A fresh copy (out tensors re-poisoned): every run writes its own outputs. A strided view keeps its strides
        (``clone`` would pack it; a kernel's pointer reaches its rows by the pitch)."""
        return {**{k: _copy(v) for k, v in self.tensors.items()}, **self.scalars}

    def error(self, outputs: dict) -> float:
        """Largest |output - reference| over all outputs (inf where a NaN is left; equal infinities match)."""
        worst = 0.0
        for name, ref in self.reference.items():
            out, ref = outputs[name].float(), ref.float()
            same = (out == ref) | (torch.isnan(out) & torch.isnan(ref))
            d = torch.where(same, torch.zeros_like(out), (out - ref).abs()).nan_to_num(float("inf"))
            worst = max(worst, float(d.max()) if d.numel() else 0.0)
        return worst

    def matches(self, outputs: dict) -> bool:
        for name, ref in self.reference.items():
            tol = self.tol[name]
            if not torch.allclose(outputs[name].float(), ref.float(), rtol=tol, atol=tol, equal_nan=True):
                return False
        return True


def _gemm_layout(p: Program):
    names = {a.name: a for a in p.args}
    if not {"a", "b", "c", "M", "N", "K"} <= set(names):
        return None
    batch = 1
    for n, e in p.grid.tiles:
        if n == "pid_b":
            batch = int(e)
    return names["a"].dims == ("K", "M"), names["b"].dims == ("N", "K"), "bias" in names, batch


def _values(shape, dtype, gen) -> torch.Tensor:
    return (torch.randint(-4, 5, shape, generator=gen).float() / 4).to(dtype)


def make_instance(program: Program, seed: int = 0, *, shape: tuple[int, ...] | None = None) -> Instance:
    """A random small problem for ``program`` and its torch reference. ``shape``: GEMM (M, N, K);
    attention (batch, q heads, kv heads, Sq, Skv)."""
    maker = MAKERS.get(program.template)
    if maker is None:
        raise InterpError(f"interp: no instance maker for program {program.name} (template "
                          f"{program.template or 'none: hand-written IR'}); the makers are for templates "
                          f"{', '.join(MAKERS)}; call run_sequential/run_partitioned with your own inputs")
    return maker(program, seed, shape)


def _gemm_instance(program: Program, seed: int, shape) -> Instance:
    lay = _gemm_layout(program)
    if lay is None:
        raise InterpError(f"interp: GEMM program {program.name} lacks the template's args a, b, c, M, N, K")
    return _gemm(program, seed, shape, *lay)


def _gemm(program: Program, seed: int, shape, trans_a: bool, trans_b: bool, bias: bool, B: int) -> Instance:
    o = program.options
    BM, BN, BK = o.block_m, o.block_n, o.block_k
    rng = random.Random(seed)
    count = max([g.count for g in program.groups] or [o.stages])
    rope = next((int(a.dims[1]) for a in program.args if a.name == "cos"), 0)  # RoPE's head dim (the tables' width)

    def tail(b):
        return 8 * rng.randrange(0, max(b // 8, 1))

    if shape is not None:
        M, N, K = shape
    else:
        ksteps = count + 1 + rng.randrange(2)
        mt = rng.choice((2, 3))
        nt = rng.choice((1, 2)) if mt == 3 else 2
        N = nt * BN - (rope * rng.randrange(0, BN // rope) if rope else tail(BN))  # RoPE: whole heads
        if B > 1:  # batches are flattened into rows: M and K must be whole tiles (the runtime checks it)
            M, K = BM * rng.choice((1, 2)), ksteps * BK
        else:
            M, K = mt * BM - tail(BM), ksteps * BK - tail(BK)
    dt = TORCH_DTYPE[program.arg("a").dtype]
    odt_name = program.arg("c").dtype
    gen = torch.Generator().manual_seed(seed)
    a = _values((B * K, M) if trans_a else (B * M, K), dt, gen)
    b = _values((B * N, K) if trans_b else (B * K, N), dt, gen)
    tensors = {"a": a, "b": b, "c": torch.full((B * M, N), float("nan"), dtype=TORCH_DTYPE[odt_name])}
    if bias:
        tensors["bias"] = _values((N,), TORCH_DTYPE[program.arg("bias").dtype], gen)
    swiglu = "bu" in {x.name for x in program.args}
    if swiglu:
        tensors["bu"] = _values(tuple(b.shape), dt, gen)
    residual = "r" in {x.name for x in program.args}
    if residual:
        tensors["r"] = _values((B * M, N), TORCH_DTYPE[program.arg("r").dtype], gen)
    save = swiglu and any(x.name == "g" and x.out for x in program.args)  # swiglu_save: G and U stored too
    if save:
        for t in ("g", "u"):
            tensors[t] = torch.full((M, N), float("nan"), dtype=TORCH_DTYPE[odt_name])
    swiglu_bwd = "du" in {x.name for x in program.args}
    if swiglu_bwd:  # the saved projections in the operand dtype, the second gradient poisoned like c
        for t in ("g", "u"):
            tensors[t] = _values((M, N), TORCH_DTYPE[program.arg(t).dtype], gen)
        tensors["du"] = torch.full((M, N), float("nan"), dtype=TORCH_DTYPE[odt_name])
    act = next((x.attr("approximate") for x in walk(program.body) if x.kind == "gelu"), None)
    scalars = {"M": M, "N": N, "K": K}
    if rope:
        if N % rope:
            raise InterpError(f"interp: a RoPE GEMM needs N a multiple of its head dim {rope}, not N={N}")
        if program.arg("cos").kind == "tensor":  # tiles by TMA (Options.epilogue_tma): no tile's rows wrap
            P = rng.choice([*range(BM, M, BM)] * 2 + [M + rng.randrange(BM)])  # a multiple of BM, or P >= M
        else:
            P = rng.randrange(1, B * M + 1)
        scalars["P"] = P
        for t in ("cos", "sin"):
            tensors[t] = _values((P, rope), TORCH_DTYPE[program.arg(t).dtype], gen)
    refs = []
    for i in range(B):
        A = a[i * K:(i + 1) * K].t() if trans_a else a[i * M:(i + 1) * M]
        Bm = b[i * N:(i + 1) * N].t() if trans_b else b[i * K:(i + 1) * K]
        r = A.float() @ Bm.float()
        if swiglu:
            bu = tensors["bu"]
            Bu = bu[i * N:(i + 1) * N].t() if trans_b else bu[i * K:(i + 1) * K]
            r_u = A.float() @ Bu.float()
            refs_saved = (r.to(TORCH_DTYPE[odt_name]), r_u.to(TORCH_DTYPE[odt_name]))
            r = torch.nn.functional.silu(r) * r_u
        if bias:
            r = r + tensors["bias"].float()
        if act is not None:
            r = torch.nn.functional.gelu(r, approximate=act)
        if rope:
            pos = torch.arange(i * M, (i + 1) * M) % scalars["P"]
            cos, sin = (tensors[t].float()[pos].repeat(1, N // rope) for t in ("cos", "sin"))
            r = r * cos + rotate_half(r, rope) * sin
        if residual:
            r = r + tensors["r"][i * M:(i + 1) * M].float()
        if swiglu_bwd:  # dh = r: du = dh silu(G), dG = dh U silu'(G), in fp32
            g, u = tensors["g"].float(), tensors["u"].float()
            s = torch.sigmoid(g)
            refs_du = (r * (g * s)).to(TORCH_DTYPE[odt_name])
            r = r * silu_grad(g, s) * u
        refs.append(r.to(TORCH_DTYPE[odt_name]))
    tiles = B * -(-M // BM) * -(-N // BN)
    if "ws" in {a.name for a in program.args}:  # passes/split_k: NaN slots (a part read unwritten shows), zero counters
        accs = sum(len(x.operands) for x in walk(program.body) if x.kind == "split_reduce")  # slots per part
        tensors["ws"] = torch.full((accs * o.split_k * tiles * BM * BN,), float("nan"))
        tensors["locks"] = torch.zeros(tiles, dtype=torch.int32)
    desc = f"M={M} N={N} K={K}" + (f" batch={B}" if B > 1 else "") + f" ({tiles} tiles, {-(-K // BK)} K steps)"
    if o.split_k > 1:
        desc += f" split {o.split_k} ways"
    if swiglu:
        desc += " swiglu"
    if residual:
        desc += " residual"
    if act is not None:
        desc += f" gelu({act})"
    if rope:
        desc += f" rope({rope}, period {scalars['P']})"
    reference, tol = {"c": torch.cat(refs)}, {"c": TOL[odt_name]}
    if swiglu_bwd:
        desc += " swiglu_bwd"
        reference["du"], tol["du"] = refs_du, TOL[odt_name]
    if save:
        desc += " (saving G and U)"
        for t, ref in zip(("g", "u"), refs_saved):
            reference[t], tol[t] = ref, TOL[odt_name]
    return Instance(desc, tensors, scalars, reference, tol)


def _attention_shape(rng: random.Random, o) -> tuple[int, int, int, int, int]:
    """(B, Hq, Hkv, Sq, Skv) at random: 1-2 batches and kv-heads, GQA groups of 1-2, lengths up to two query tiles
    and three key tiles (ragged)."""
    B, Hkv, G = rng.choice((1, 2)), rng.choice((1, 2)), rng.choice((1, 2))
    return B, Hkv * G, Hkv, rng.randrange(1, 2 * o.block_m + 1), rng.randrange(1, 3 * o.block_n + 1)


def _attention(program: Program, seed: int, shape) -> Instance:
    o = program.options
    rng = random.Random(seed)
    # the columns the q and v tiles cover: one tile (maybe padded past D), or the pieces of a split head dim (split_d)
    tile, tile_v = (sum(x.results[0].type.shape[-1] for x in walk(program.body)
                        if x.kind == "load" and program.base_arg(x.attr("arg")) == t and x.chain in (None, 0))
                    for t in ("q", "v"))
    # a head dim narrower than the tiles (templates.attention.tile_d) is the output store's column bound (a v head
    # dim other than q's comes only in tiles ending at the head's last column, templates.attention)
    D = next((x.attr("cols_valid") for x in walk(program.body) if x.kind == "store_ptr" and x.attr("cols_valid")), tile)
    Dv = D if tile_v == tile else tile_v
    causal = any(x.attr("causal") for x in walk(program.body) if x.kind == "mask")
    B, Hq, Hkv, Sq, Skv = shape if shape is not None else _attention_shape(rng, o)
    if shape is None and program.arg("o").kind == "tensor":  # O by TMA store: whole query tiles only (o_tma)
        Sq = -(-Sq // o.block_m) * o.block_m
    dt = TORCH_DTYPE[program.arg("q").dtype]
    gen = torch.Generator().manual_seed(seed)
    q4, k4, v4 = (torch.randn((B, h, s, d), generator=gen).to(dt) for h, s, d in ((Hq, Sq, D), (Hkv, Skv, D),
                                                                                   (Hkv, Skv, Dv)))
    # SDPA's default scale, or the edge cases a caller may pass: 0 (uniform rows) and negative
    scale = random.Random(f"scale{seed}").choice((D ** -0.5, D ** -0.5, 0.0, -0.3))
    if o.raw_max:  # that form holds for positive scales only (the runtime builds the other one for the rest)
        scale = abs(scale) or D ** -0.5
    s4 = q4.float() @ k4.float().repeat_interleave(Hq // Hkv, 1).transpose(2, 3)
    s4 = s4 * scale
    if causal:  # top-left aligned, like F.scaled_dot_product_attention(is_causal=True)
        s4 = s4.masked_fill(torch.ones(Sq, Skv, dtype=torch.bool).tril().logical_not(), float("-inf"))
    lse = torch.logsumexp(s4, -1)
    p = torch.exp(s4 - lse[..., None]).masked_fill(torch.isneginf(lse)[..., None], 0.0)  # NaN stays NaN
    out = p @ v4.float().repeat_interleave(Hq // Hkv, 1)
    # q and k/v each in the [B, H, S, D] or the [B, S, H, D] layout (see templates.attention); with tiles wider than
    # D, [B, S, H, D] rows only for one head, as the runtime reads them (runtime.attention._in_place's own_cols)
    q_bshd, kv_bshd = rng.random() < 0.5, rng.random() < 0.5
    if tile != D:
        q_bshd, kv_bshd = q_bshd and Hq == 1, kv_bshd and Hkv == 1
    if Dv != D:  # k and v share their (rb, rh, ch): [B, S, H, D] rows of two head dims only with one head
        kv_bshd = kv_bshd and Hkv == 1

    def rows(t4, bshd):
        b, h, s, d = t4.shape
        if bshd:
            return t4.transpose(1, 2).reshape(b * s, h * d).contiguous(), (s, 0, d)
        return t4.reshape(b * h * s, d).contiguous(), (h * s, s, 0)

    (q, qr), (k, kr), (v, _) = rows(q4, q_bshd), rows(k4, kv_bshd), rows(v4, kv_bshd)
    o_bshd = rng.random() < 0.5  # the output in either layout, independent of q's
    o_ref, orr = rows(out.to(dt), o_bshd)
    tensors = {"q": q, "k": k, "v": v, "o": torch.full_like(o_ref, float("nan")),
               "lse": torch.full((B * Hq * Sq,), float("nan"))}
    scalars = {"Sq": Sq, "Skv": Skv, "Hq": Hq, "Hkv": Hkv, "G": Hq // Hkv, "qk_scale": scale * 1.4426950408889634,
               "BH": B * Hq, **dict(zip(("q_rb", "q_rh", "q_ch"), qr)), **dict(zip(("kv_rb", "kv_rh", "kv_ch"), kr)),
               **dict(zip(("o_rb", "o_rh", "o_ch"), orr))}
    desc = f"batch={B} Hq={Hq} Hkv={Hkv} Sq={Sq} Skv={Skv} D={D}" + (f" Dv={Dv}" if Dv != D else "") + \
        (" causal" if causal else "") + \
        (" q:BSHD" if q_bshd else "") + (" kv:BSHD" if kv_bshd else "") + (" o:BSHD" if o_bshd else "") + \
        (f" scale={scale}" if scale != D ** -0.5 else "")
    ref = {"o": o_ref, "lse": lse.reshape(-1)}
    return Instance(desc, tensors, scalars, ref, {"o": 2 * TOL[program.arg("q").dtype], "lse": 1e-4})


def _bwd_problem(program: Program, seed: int, shape):
    """A random backward problem for an attention_bwd / attention_bwd_dq program: (inputs, fp32 math gradients,
    preprocess outputs, desc). Inputs are rounded to the program's dtype; the references use the rounded values."""
    from ..templates import attention_bwd as bwd

    o = program.options
    rng = random.Random(seed)
    D = next(x.results[0].type.shape[-1] for x in walk(program.body) if x.kind == "load" and x.attr("arg") == "q")
    causal = any(x.attr("causal") for x in walk(program.body) if x.kind == "mask")
    B, Hq, Hkv, Sq, Skv = shape if shape is not None else _attention_shape(rng, o)
    tma_out = {a.name for a in program.args if a.out and a.kind == "tensor"}
    if shape is None:  # gradients stored by TMA (kv_tma, dq_tma): whole tiles only, as the runtime launches them
        Skv = -(-Skv // o.block_n) * o.block_n if "dk" in tma_out else Skv
        Sq = -(-Sq // o.block_m) * o.block_m if "dq" in tma_out else Sq
    dt = TORCH_DTYPE[program.arg("q").dtype]
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn((B, h, s, D), generator=gen).to(dt) for h, s in ((Hq, Sq), (Hkv, Skv), (Hkv, Skv)))
    go = torch.randn((B, Hq, Sq, D), generator=gen).to(dt)
    glse = torch.randn((B, Hq, Sq), generator=gen) if rng.random() < 0.5 else None
    if rng.random() < 0.5:  # q/dO and k/v in the [B, S, H, D] memory layout
        q, go = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, go))
    if rng.random() < 0.5:
        k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (k, v))
    scale = D ** -0.5
    G = Hq // Hkv
    kf, vf = (t.float().repeat_interleave(G, 1) for t in (k, v))
    s = q.float() @ kf.transpose(2, 3) * scale
    if causal:
        s = s.masked_fill(torch.ones(Sq, Skv, dtype=torch.bool).tril().logical_not(), float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    out = (p @ vf).to(dt)
    ds = p * (go.float() @ vf.transpose(2, 3) - (go.float() * out.float()).sum(-1, keepdim=True)
              + (glse[..., None] if glse is not None else 0.0))
    grads = {"dq_acc": (ds @ kf).reshape(-1, D), "dq": (ds @ kf * scale).to(dt).reshape(-1, D),
             "dk": (ds.transpose(2, 3) @ q.float() * scale).view(B, Hkv, G, Skv, D).sum(2).to(dt).reshape(-1, D),
             "dv": (p.transpose(2, 3) @ go.float()).view(B, Hkv, G, Skv, D).sum(2).to(dt).reshape(-1, D)}
    delta, lse2 = bwd.preprocess(out, go, lse, glse)
    desc = f"batch={B} Hq={Hq} Hkv={Hkv} Sq={Sq} Skv={Skv} D={D}" + (" causal" if causal else "") + \
        (" grad_lse" if glse is not None else "")
    return (q, k, v, go, causal, scale), grads, (delta, lse2), desc


def _bwd_instance(program: Program, vals: dict, grads: dict, desc: str) -> Instance:
    tensors = {a.name: vals[a.name] for a in program.args if a.kind != "scalar"}
    scalars = {a.name: vals[a.name] for a in program.args if a.kind == "scalar"}
    ref = {a.name: grads[a.name] for a in program.args if a.out}
    tol = 1e-4 if program.arg("q").dtype == "f32" else 5e-2
    return Instance(desc, tensors, scalars, ref, {n: tol for n in ref})


def _attention_bwd(program: Program, seed: int, shape) -> Instance:
    """The backward's main kernel between its host-side pre/postprocess (templates.attention_bwd): outputs dq_acc
    (the unscaled dS K, fp32; in the reduce form padded to whole Q blocks per head, zero past Sq; absent from the form
    built with dq="none"), dk and dv against an fp32 math backward of
    the same rounded inputs. dk/dv start as NaN except the rows of KV blocks the kernel is not launched for (the host
    zeroes those); dq_acc starts zero, as the host's preprocess leaves it."""
    from ..templates import attention_bwd as bwd

    (q, k, v, go, causal, scale), grads, (delta, lse2), desc = _bwd_problem(program, seed, shape)
    ws = next((a for a in program.args if a.name == "dq_acc"), None)
    form = "none" if ws is None else "reduce" if ws.kind == "tensor" else "atomic"
    BM = program.options.block_m
    vals = bwd.kernel_values(q, k, v, go, delta, lse2, causal, scale, program.options.block_n, fill=float("nan"),
                             dq=form, block_m=BM, fold=program.options.fold_rows)
    if form == "reduce":  # the workspace has padded_rows per head; the rows past Sq get exact zeros
        B, Hq, Sq, D = q.shape
        ref = torch.zeros(B, Hq, bwd.padded_rows(Sq, BM), D)
        ref[:, :, :Sq] = grads["dq_acc"].view(B, Hq, Sq, D)
        grads = {**grads, "dq_acc": ref.reshape(-1, D)}
    return _bwd_instance(program, vals, grads, desc)


def _attention_bwd_dq(program: Program, seed: int, shape) -> Instance:
    """The backward's separate dQ kernel (templates.attention_bwd_dq) after the preprocess: dq (NaN-poisoned before)
    against the fp32 math backward's scale * dS K, rounded to the program's dtype."""
    from ..templates import attention_bwd_dq as bwd_dq

    (q, k, v, go, causal, scale), grads, (delta, lse2), desc = _bwd_problem(program, seed, shape)
    vals = bwd_dq.kernel_values(q, k, v, go, delta, lse2, causal, scale, fill=float("nan"))
    return _bwd_instance(program, vals, grads, desc)


#: An instance maker per template (``Program.template``, set by the template's build): a new template adds its own.
MAKERS = {"gemm": _gemm_instance, "attention": _attention, "attention_bwd": _attention_bwd,
          "attention_bwd_dq": _attention_bwd_dq}
