"""Attention forward template: softmax(scale * Q K^T [causal]) V and the row log-sum-exp, torch SDPA semantics.

One output tile is BM query rows of one (batch, q-head). q, k and v are read through 2-D TMA views
whose rows are sequence positions: element (b, h, s, d) is at row ``b*rb + h*rh + s``, column
``h*ch + d``, with (rb, rh, ch) run-time scalars per tensor, so both the [B, H, S, D] layout
(rb=H*S, rh=S, ch=0) and the [B, S, H, D] layout models produce before a transpose (rb=S, rh=0,
ch=D) are read in place. GQA maps q-head h to kv-head h // (Hq // Hkv). o is written the same way
through a pointer, with its own (o_rb, o_rh, o_ch) and rows of D + (Hq-1)*o_ch elements, so a caller
can have the output in q's layout (a model's transpose back to [B, S, H*D] is then a view); lse is
[B*Hq*Sq]. With ``AttentionRequest.o_tma`` (the caller guarantees Sq % BM == 0, and the tiles end at the head's last
column: a power-of-two head dim or ``split_d``; so no tile row or column of O lies outside its head) o is a TMA row
view like q's and the tile is stored by TMA from SMEM: asynchronous, whole 128-byte lines, where the pointer store
is one 4-byte store a register pair that the consumers wait on (the pointer stores were 19% of the kernel's time at
s512 d=128 on the H200, 5% at s4096: bench/results/sweeps, ``attention_ablate.py --fwd-epilogue``). passes/buffers
stages it in the consumer's own Q slot, whose tile it has finished reading by then, so it needs no SMEM of its own.
Head dims 96 and 192 run in tiles of 128 and 256 columns (``tile_d``: Gluon tensors have power-of-two shapes):
the caller's q/k/v views must end each row at the head's last column (TMA then reads the padding columns as
zeros, so they add nothing to Q K^T; V's padding only feeds output columns past D), and the output store is
bounded to D columns (``store_ptr``'s ``cols_valid``). With ``Options.split_d`` they run instead in equal
power-of-two column pieces (``d_pieces``: 192 = 3 x 64): Q K^T is one mma a piece chained into S, and each piece
has its own accumulator, P V mma and store, so no wgmma works on padding and every tile ends inside its head.
With ``Options.split_d_binary`` the pieces are the widest powers of two first (192 = 128 + 64: fewer, wider
wgmmas); a width other than the first piece's reads and writes its tensor through an alias arg (``q_w64`` for q:
``Arg.alias``, a TMA descriptor of its own block shape on the same tensor).
``AttentionRequest.d_v`` gives v and o a head dim of their own (DeepSeek-style MLA prefill: q/k 192, v 128): Q K^T runs
in q's pieces, the accumulators, P V and the stores in v's; both must be tiles that end at their head's last column
(powers of two or ``split_d`` pieces), so no padding column meets another head's, and the caller gives k and v one
row addressing (kv_rb, kv_rh, kv_ch: [B, H, S, D] rows, or one kv head).
A KV tile that runs past Skv reads other rows of the tensor (or TMA zeros): the ``mask`` op sets
those scores to -inf, so their probabilities are exactly 0. Query rows past Sq are computed but never
stored (``store_ptr``/``store_vec`` mask rows). Causal masking is top-left aligned (col <= row), as
``F.scaled_dot_product_attention(is_causal=True)``; the KV loop stops after the diagonal block.

Online softmax in base 2 (``qk_scale`` = scale * log2 e, applied before the mask): per KV block,
m' = max(m, rowmax(s)), p = exp2(s - m'), l' = l * exp2(m - m') + rowsum(p), acc' = acc * exp2(m - m') + p V. A row with
every score masked keeps m = -inf; ``fin0`` turns that -inf into 0 inside the exponentials so no
NaN appears, and the epilogue writes 0 for such rows (lse = -inf), with no 0/0. With
``options.raw_max`` (positive scales only; the runtime builds the other form for the rest) m is kept
on unscaled scores and p = exp2(s*c - m*c), one FFMA per score instead of a multiply and a subtract.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ir import Arg, Grid, Options, Program, TileType, Value, op

#: Head dims the template takes. 96 and 192 run in tiles of 128 and 256 columns (``tile_d``).
HEAD_DIMS = (64, 96, 128, 192, 256)


@dataclass(frozen=True)
class AttentionRequest:
    d: int
    dtype: str = "bf16"
    causal: bool = False
    o_tma: bool = False  # O by TMA store (module docstring): Sq % block_m == 0, tiles ending at the head's last column
    d_v: int = 0  # the head dim of v and o where it differs from q's and k's ``d`` (0: the same)

    def __post_init__(self):
        if self.dtype not in ("bf16", "fp16"):
            raise ValueError(f"attention template: dtype {self.dtype!r} not served; use bf16 or fp16")
        for name, d in (("head dim", self.d), ("v head dim", self.dv)):
            if d not in HEAD_DIMS:
                raise ValueError(f"attention template: {name} {d} not served; use one of {HEAD_DIMS}")

    @property
    def dv(self) -> int:
        """The head dim of v and o."""
        return self.d_v or self.d


def tile_d(d: int) -> int:
    """The width of the kernel's q/k/v/o tiles for head dim ``d``: the power of two at or above it (Gluon
    tensors have power-of-two shapes)."""
    return 1 << (d - 1).bit_length()


def d_pieces(d: int, binary: bool = False) -> tuple[tuple[int, int], ...]:
    """(first column, width) of the column pieces a head dim splits into. Equal widths, the largest power of two that
    divides d (192: three of 64; 96: three of 32; a power of two is one piece), so each tensor is read and written in
    one TMA block shape; or, ``binary``, the widest powers of two first (192: 128 + 64; 96: 64 + 32): fewer and wider
    wgmmas, a TMA block shape (descriptor) per width. ``Options.split_d`` runs each piece as its own tiles instead of
    one tile of ``tile_d(d)`` columns (``Options.split_d_binary`` the binary pieces)."""
    if binary:
        out, c = [], 0
        for bit in reversed(range(d.bit_length())):
            if d >> bit & 1:
                out.append((c, 1 << bit))
                c += 1 << bit
        return tuple(out)
    w = d & -d
    return tuple((c, w) for c in range(0, d, w))


def pieces(d: int, opts: Options) -> tuple[tuple[int, int], ...]:
    """The column pieces ``build`` runs for head dim ``d`` under ``opts``: ``d_pieces`` with ``split_d``, else one
    tile of ``tile_d`` columns (padded)."""
    return d_pieces(d, opts.split_d_binary) if opts.split_d else ((0, tile_d(d)),)


def arg_of(base: str, cols: tuple[tuple[int, int], ...], i: int) -> str:
    """The tensor arg piece ``i`` of ``cols`` reads or writes ``base`` through: ``base`` itself for the first piece's
    width, else the alias of its width (``<base>_w<width>``, an ``Arg.alias`` of ``base``)."""
    w = cols[i][1]
    return base if w == cols[0][1] else f"{base}_w{w}"


def tile_cols(d: int, opts: Options) -> int:
    """The columns the q/k/v/o tiles cover for head dim ``d``: d itself (a power of two, or in pieces), or more (the
    padding of ``tile_d``), which the runtime must then read as zeros and may not store by TMA."""
    return sum(w for _, w in pieces(d, opts))


def build(req: AttentionRequest, opts: Options) -> Program:
    BM, BN, dt = opts.block_m, opts.block_n, req.dtype
    cols = pieces(req.d, opts)  # of q and k (Q K^T)
    cols_v = pieces(req.dv, opts)  # of v, the accumulators and o (P V)
    D = tile_cols(req.dv, opts)
    if req.o_tma and D != req.dv:
        raise ValueError(f"attention template: o_tma needs tiles that end at the head's last column (a power-of-two "
                         f"head dim, or split_d); d={req.dv} in {D}-column tiles would store {D - req.dv} columns of "
                         f"the next head: use o_tma=False")
    if req.dv != req.d and (tile_cols(req.d, opts) != req.d or D != req.dv):
        raise ValueError(f"attention template: head dims {req.d} (q, k) and {req.dv} (v, o) need tiles that end at "
                         f"each head's last column (powers of two, or split_d): no padding column may meet another "
                         f"head's")
    T = TileType
    dv = "D" if req.dv == req.d else "Dv"
    args = (Arg("q", "tensor", dt, ("BHSq", "D")), Arg("k", "tensor", dt, ("BHSkv", "D")),
            Arg("v", "tensor", dt, ("BHSkv", dv)),
            Arg("o", "tensor" if req.o_tma else "ptr", dt, ("BHSq", dv), out=True),
            Arg("lse", "ptr", "f32", ("BHSq",), out=True),
            Arg("Sq", "scalar", "i32"), Arg("Skv", "scalar", "i32"), Arg("Hq", "scalar", "i32"),
            Arg("Hkv", "scalar", "i32"), Arg("G", "scalar", "i32"), Arg("qk_scale", "scalar", "f32"),
            Arg("q_rb", "scalar", "i32"), Arg("q_rh", "scalar", "i32"), Arg("q_ch", "scalar", "i32"),
            Arg("kv_rb", "scalar", "i32"), Arg("kv_rh", "scalar", "i32"), Arg("kv_ch", "scalar", "i32"),
            Arg("o_rb", "scalar", "i32"), Arg("o_rh", "scalar", "i32"), Arg("o_ch", "scalar", "i32"))
    # Causal tiles differ in length (the KV loop stops at the diagonal): walk them longest first, all
    # heads' last query tiles before any head's first, so a persistent grid ends with short tiles
    # (``serpentine`` then evens out what each CTA gets per wave).
    mi = "(cdiv(Sq,%d)-1-pid_m)" % BM if req.causal else "pid_m"
    row0 = "%s*%d" % (mi, BM)  # first query row of this tile inside its head
    lse_row = "pid_bh*Sq+%s*%d" % (mi, BM)  # of lse ([B*Hq*Sq])
    o_row = "(pid_bh//Hq)*o_rb+(pid_bh%%Hq)*o_rh+%s*%d" % (mi, BM)
    q_at = ("(pid_bh//Hq)*q_rb+(pid_bh%%Hq)*q_rh+%s*%d" % (mi, BM), "(pid_bh%Hq)*q_ch")
    kv_at = ("(pid_bh//Hq)*kv_rb+((pid_bh%%Hq)//G)*kv_rh+j*%d" % BN, "((pid_bh%Hq)//G)*kv_ch")
    ub = "cdiv(Skv,%d)" % BN
    if req.causal:  # blocks strictly right of the diagonal are fully masked: skip them
        ub = "min(cdiv(Skv,%d),cdiv(%s*%d+%d,%d))" % (BN, mi, BM, BM, BN)
    s_t, row_t = T("f32", (BM, BN)), T("f32", (BM,))
    if opts.raw_max:  # m on raw scores; the scale folds into one FFMA per score: exp2(s*c - m*c), for c > 0
        scores = (
            op("mask", [Value("s_m", s_t)], ["s"], row=row0, col="j*%d" % BN, kv_len="Skv", causal=req.causal),
            op("reduce_max", [Value("mx", row_t)], ["s_m"], axis=1),
            op("max", [Value("m_new", row_t)], ["m", "mx"]),
            op("fin0", [Value("m_use", row_t)], ["m_new"]),
            op("sub", [Value("dm_raw", row_t)], ["m", "m_use"]),
            op("mulc", [Value("dm", row_t)], ["dm_raw"], c="qk_scale"),
            op("exp2", [Value("alpha", row_t)], ["dm"]),
            op("mulc", [Value("m_sc", row_t)], ["m_use"], c="qk_scale"),
            op("expand", [Value("m_col", T("f32", (BM, 1)))], ["m_sc"], axis=1),
            op("mulc", [Value("s2", s_t)], ["s_m"], c="qk_scale"),  # only feeds the sub: ptxas fuses an FFMA
            op("sub", [Value("sd", s_t)], ["s2", "m_col"]),
        )
    else:  # scale, then mask: a masked score is -inf for any scale (0 * -inf would be NaN, -c * -inf +inf)
        scores = (
            op("mulc", [Value("s2", s_t)], ["s"], c="qk_scale"),
            op("mask", [Value("s_m", s_t)], ["s2"], row=row0, col="j*%d" % BN, kv_len="Skv", causal=req.causal),
            op("reduce_max", [Value("mx", row_t)], ["s_m"], axis=1),
            op("max", [Value("m_new", row_t)], ["m", "mx"]),
            op("fin0", [Value("m_use", row_t)], ["m_new"]),
            op("sub", [Value("dm", row_t)], ["m", "m_use"]),
            op("exp2", [Value("alpha", row_t)], ["dm"]),
            op("expand", [Value("m_col", T("f32", (BM, 1)))], ["m_use"], axis=1),
            op("sub", [Value("sd", s_t)], ["s_m", "m_col"]),
        )
    n = len(cols)

    def nm(base: str, i: int) -> str:  # piece 0 keeps the plain names (one piece: the IR as before pieces)
        return base if i == 0 else "%s_p%d" % (base, i)

    def at(coords: tuple[str, str], c0: int) -> tuple[str, str]:
        return coords if c0 == 0 else (coords[0], "%s+%d" % (coords[1], c0))

    def acc_t(i: int) -> TileType:
        return T("f32", (BM, cols_v[i][1]))

    nv = len(cols_v)

    # S = sum over pieces of Q_i K_i^T, chained through the accumulator (the last one is S)
    qa = "qr" if opts.q_regs else "q"  # Q K^T's A: Q's SMEM tile, or its registers (q_regs)
    qk = [op("mma", [Value("s" if i == n - 1 else "s_k%d" % i, s_t)],
             [nm(qa, i), nm("kt", i)] + ([] if i == 0 else ["s_k%d" % (i - 1)]))
          for i in range(n)]
    loop_body = (
        *(op("load", [Value(nm("k", i), T(dt, (BN, w), "smem"))], arg=arg_of("k", cols, i), coords=at(kv_at, c0))
          for i, (c0, w) in enumerate(cols)),
        *(op("load", [Value(nm("v", i), T(dt, (BN, w), "smem"))], arg=arg_of("v", cols_v, i),
             coords=at(kv_at, c0)) for i, (c0, w) in enumerate(cols_v)),
        *(op("trans", [Value(nm("kt", i), T(dt, (w, BN), "smem"))], [nm("k", i)]) for i, (_, w) in enumerate(cols)),
        *qk,
        *scores,
        op("exp2", [Value("p", s_t)], ["sd"]),
        op("reduce_sum", [Value("ps", row_t)], ["p"], axis=1),
        op("mul", [Value("la", row_t)], ["l", "alpha"]),
        op("add", [Value("l_new", row_t)], ["la", "ps"]),
        op("expand", [Value("a_col", T("f32", (BM, 1)))], ["alpha"], axis=1),
        *(op("mul", [Value(nm("acc_s", i), acc_t(i))], [nm("acc", i), "a_col"]) for i in range(nv)),
        op("cast", [Value("p16", T(dt, (BM, BN)))], ["p"]),
        *(op("mma", [Value(nm("acc_new", i), acc_t(i))], ["p16", nm("v", i), nm("acc_s", i)]) for i in range(nv)),
        op("yield", [], ["m_new", "l_new", *(nm("acc_new", i) for i in range(nv))]),
    )
    o_col = "(pid_bh%Hq)*o_ch"
    stores = []
    for i, (c0, w) in enumerate(cols_v):
        stores += [op("mul", [Value(nm("out_f", i), acc_t(i))], [nm("acc_f", i), "rl_col"]),
                   op("cast", [Value(nm("out", i), T(dt, (BM, w)))], [nm("out_f", i)])]
        col = o_col if c0 == 0 else "%s+%d" % (o_col, c0)
        stores.append(
            op("store", [], [nm("out", i)], arg=arg_of("o", cols_v, i), coords=(o_row, col)) if req.o_tma else
            op("store_ptr", [], [nm("out", i)], arg="o", row=o_row, col=col, ld="%d+(Hq-1)*o_ch" % req.dv,
               rows_valid="Sq-%s*%d" % (mi, BM), **({"cols_valid": req.dv} if D != req.dv else {})))
    body = (
        *(op("load", [Value(nm("q", i), T(dt, (BM, w), "smem"))], arg=arg_of("q", cols, i), coords=at(q_at, c0))
          for i, (c0, w) in enumerate(cols)),
        *(op("smem_read", [Value(nm("qr", i), T(dt, (BM, w)))], [nm("q", i)])
          for i, (c0, w) in enumerate(cols) if opts.q_regs),
        op("full", [Value("m0", row_t)], value="-inf"),  # a string: the IR text stays literal_eval-able
        op("full", [Value("l0", row_t)], value=0.0),
        *(op("zeros", [Value(nm("acc0", i), acc_t(i))]) for i in range(nv)),
        op("loop", [Value("m_f", row_t), Value("l_f", row_t), *(Value(nm("acc_f", i), acc_t(i)) for i in range(nv))],
           ["m0", "l0", *(nm("acc0", i) for i in range(nv))], loop_body, var="j", lb=0, ub=ub,
           iter_args=("m", "l", *(nm("acc", i) for i in range(nv))), min_trip=1),
        # epilogue: out = acc * (1 / l) (0 where l == 0: then every P and acc are 0), lse = (m + log2 l) * ln 2; one
        # reciprocal a row and a multiply an element (a division an element was 369 of the epilogue's 728 SASS
        # instructions a tile at d=128, offline sm_90a); O by TMA store (o_tma) or through a pointer, a piece at a time
        op("full", [Value("one", row_t)], value=1.0),
        op("div0", [Value("rl", row_t)], ["one", "l_f"]),
        op("expand", [Value("rl_col", T("f32", (BM, 1)))], ["rl"], axis=1),
        *stores,
        *((op("mulc", [Value("m_fs", row_t)], ["m_f"], c="qk_scale"),) if opts.raw_max else ()),
        op("lse", [Value("lse_v", row_t)], ["m_fs" if opts.raw_max else "m_f", "l_f"]),
        op("store_vec", [], ["lse_v"], arg="lse", offset=lse_row, valid="Sq-%s*%d" % (mi, BM)),
    )
    name = (f"attn_fwd_{dt}_d{req.d}" + (f"v{req.dv}" if req.dv != req.d else "") + f"_{BM}x{BN}"
            + ("_causal" if req.causal else "") + ("_otma" if req.o_tma else "")
            + ("_x%d" % n if n > 1 else ""))  # in n column pieces (of q and k)
    tiles = (("pid_bh", "BH"), ("pid_m", "cdiv(Sq,%d)" % BM))
    # causal: ``group_m`` query tiles of a head run back to back (1: every head's longest tile first)
    grid = (Grid(tiles[::-1], opts.persistent, opts.group_m, opts.serpentine) if req.causal
            else Grid(tiles, opts.persistent, 1, opts.serpentine))
    # the pieces' other widths: the same tensors through descriptors of their own block shapes
    def cols_of(arg: str) -> tuple[tuple[int, int], ...]:
        return cols_v if arg in ("v", "o") else cols

    aliases = tuple(Arg(name, "tensor", dt, a.dims, a.out, alias=a.name) for a in args if a.kind == "tensor"
                    for name in dict.fromkeys(arg_of(a.name, cols_of(a.name), i) for i in range(len(cols_of(a.name))))
                    if name != a.name)
    return Program(name, args + (Arg("BH", "scalar", "i32"),) + aliases, grid, opts, body, template="attention")
