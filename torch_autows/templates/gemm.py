"""GEMM template: C[M, N] (+ bias[N]) = A[M, K] @ B[K, N], optional batch, fp32 accumulation.

A and B may each be row-major or a transposed view (column-major): the Arg describes memory, and a
``trans`` op turns the loaded [BK, BM] (or [BN, BK]) tile into the logical one, a free SMEM view
that wgmma reads directly. Batched GEMMs add a tile index ``pid_b``; the tensors are then 2-D views
of the batch flattened into rows (the runtime checks that tiles never straddle two batches).

Epilogues (``GemmRequest.epilogue``): "none" stores the (biased) accumulator; "swiglu" is the Llama MLP's
gate and up projections in one kernel, ``C = silu(A @ B) * (A @ Bu)``: every K step loads a second weight
tile (arg ``bu``, laid out as ``b``) and runs a second mma into a second accumulator; after the loop the
epilogue computes ``silu(acc) * acc_u`` in fp32, then casts and stores. The passes see a loop that carries
two accumulators and split it like any other (data_partition splits both, split_k reduces both).

``GemmRequest.residual`` adds R, an [M, N] tensor of the operand dtype (row-major, leading dim N; arg ``r``,
a pointer; batched: [batch*M, N] like c), to the fp32 accumulator after the bias and before the cast:
``C = A @ B (+ bias) + R`` with one rounding (nn.Linear's output plus the residual stream, ``h = x + o_proj(o)``).
The epilogue loads R's [BM, BN] tile with ``load_ptr``, a masked pointer load straight into registers in the
accumulator's layout: it runs in the consumer partition that owns the tile's rows (data_partition splits it by
rows like the accumulator), needs no SMEM ring or producer work, and after split_k it reads the reduced sum (only
the CTA that stores adds it).

``GemmRequest.activation`` applies an activation to the fp32 sum after the bias and before the cast:
``C = act(A @ B (+ bias))`` with one rounding (GPT-2's ``c_fc``: nn.Linear then nn.GELU). "gelu_tanh" is
``F.gelu(x, approximate="tanh")``, "gelu" the exact erf form; an IR ``gelu`` op (attr ``approximate``) on the
accumulator's registers, no memory traffic. Order: bias, then the activation, then (were it allowed) a residual:
the activation belongs to the linear layer and a residual adds after it, but no model here needs both in one
kernel, so activation + residual and activation + swiglu are refused. After split_k the activation reads the
reduced sum (a non-linear op applied once, by the CTA that stores; the other CTAs compute on zeros and store
nothing).

``GemmRequest.rope`` (a head dim D > 0, even) applies rotary position embedding to every head of D columns after the
bias, in fp32 before the one rounding: ``C = rope(A @ B (+ bias))``, ``rope(x) = x * cos + rotate_half(x) * sin`` per
head, ``rotate_half`` as the models write it (``cat(-x2, x1)`` of the head's halves), with cos/sin [P, D] tables of
the operand dtype (args ``cos``, ``sin``; row-major) read at row ``m % P`` (P, a run-time scalar: the sequence length
when rows are [batch, sequence] flattened and the positions repeat per sequence, or M for a table per row) and
column ``n % D``. That is the Llama q/k projections' RoPE in their epilogue (issue 16): no write and read back of q/k
between the GEMM and a pointwise kernel. The tables' tiles come in by ``load_ptr`` (``row_mod``/``col_mod``), the
rotation is a ``rotate_half`` op, register-only in wgmma's accumulator layout (passes/README.md); a tile holds whole
heads (BN a multiple of D). Refused with swiglu, a residual, an activation or a batch.

``epilogue="swiglu_save"`` is swiglu for a training graph, which saves G = A @ B and U = A @ Bu for the backward:
the epilogue also stores them (out args ``g``, ``u``, each rounded once from its accumulator, as the GEMMs alone
would), so the forward writes G, U and C where the default writes G and U, reads them back and writes C. Refused
swapped or with split-K.

``epilogue="swiglu_bwd"`` is the SwiGLU MLP's backward at its first GEMM (issue 16's training rewrite): with
``dh = A @ B`` (A the gradient of the MLP's output, B the down projection's weight) and the forward's saved gate and
up projections G and U ([M, N] of the operand dtype, args ``g``, ``u``), the epilogue writes both gradients of the
product ``silu(G) * U`` in fp32 before their one rounding: ``du = dh * silu(G)`` (out arg ``du``) and
``dG = dh * U * silu'(G)`` (out arg ``c``), ``silu'(x) = s (1 + x (1 - s))``, ``s = sigmoid(x)`` (``sigmoid`` and
``silu_grad`` ops: one sigmoid for both gradients).
Inductor would write dh, then read it back with G and U in a pointwise kernel; here dh never leaves the registers.
G and U come in as the residual's R does (pointer loads, or by TMA with ``Options.epilogue_tma``). Batch 1, no bias,
residual, activation, RoPE, swap-AB or split-K (two stores of the one reduced sum are not built).
``Options.epilogue_chunk`` (with ``epilogue_tma``) runs this epilogue in column chunks: the accumulator split in
registers (``col_split``), G's and U's chunks read through ``slice`` views of their tiles, each chunk's du and dG
stored by TMA at once (``swiglu_bwd_chunks``), so a 256-wide tile's temporaries take a chunk's registers.

``Options.epilogue_tma`` brings the epilogue's operand tiles (R; cos and sin) by TMA instead: args of kind "tensor",
``load`` ops after the K loop, so the producer partition loads them into SMEM while the consumers run the tile's last
K steps, an ``smem_read`` into the accumulator's layout and a ``cast`` to fp32 in the consumer (passes/buffers then
reuses the tile's slot as the store's staging tile). Pointer loads in the consumer are issued by every CTA at once
after its last mma, with the tensor cores idle: on the H200 the TMA form ran the RoPE q projection (16384x4096x4096,
128x128 tiles) in 903 us against 984, the o_proj residual 874 against 907 (bench/results/sweeps, epilogue_tma).
Out-of-range rows and columns read as zeros. The tables' rows are ``(m0 % P) + r``: the caller keeps a tile's rows
inside the table (P a multiple of BM, or P >= M) and a tile one head wide (BN = D, refused otherwise). Refused with
split_k > 1 (only the CTA that stores reads the operands; every part's producer would load them).

Swap-AB (``Options.swap_ab``; decode: M of 1..64 rows against a large weight): wgmma's M slot is 64 rows per
warpgroup, so a tile of a few activation rows there is mostly zero padding (75-98% of the A tile in SMEM and of
each wgmma at M <= 16). Swapped, the Program computes the tile of C^T = B^T A^T: the weight's [BN, BK] tile (B^T,
memory [N, K] row-major: nn.Linear's ``w``, i.e. ``trans_b``) is wgmma's A operand, the activations' [BM, BK] tile
(A row-major, BM = ``block_m`` in 8..64) transposed in SMEM is the B operand (wgmma's N = BM), the accumulator is
[BN, BM], and the epilogue stores it transposed into C [M, N] with ``store_ptr`` (``transposed``: accumulator row r,
column c -> C[col + c, row + r], masked at the M and N edges); the bias is per N, i.e. per accumulator row. The
swiglu epilogue swaps the same way: both weights' [BN, BK] tiles are A operands of their own mma, two [BN, BM]
accumulators, ``silu(acc) * acc_u`` elementwise (the layout does not matter to it), one transposed store. Only
that layout is served (``swap_ab`` with ``trans_a``, without ``trans_b``, batched, residual or an activation is
refused); split_k splits it like any sum (its workspace slots are accumulator-shaped, [BN, BM]).
It is an ``Options`` field, not a ``GemmRequest`` one: the request is what to compute (the same numbers either way),
Options how; a config (runtime.gemm_configs) then names the whole kernel, ``config=`` needs nothing beside it, and
the kernel cache key (request, options) tells the two kernels apart.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..ir import Arg, Grid, Options, Program, TileType, Value, op
from .gemm_epilogue import prefetched, rope_chunks, swiglu_bwd_chunks, swiglu_bwd_grads, tma_operand_tile

#: The epilogues the template builds: "none" (C = A @ B (+ bias)), "swiglu" (C = silu(A @ B) * (A @ Bu)),
#: "swiglu_save" (swiglu, also storing G = A @ B and U = A @ Bu, which a training graph saves for the backward),
#: "swiglu_bwd" (the SwiGLU backward's dh GEMM: C = dG and DU from dh = A @ B and the saved G, U; module docstring).
EPILOGUES = ("none", "swiglu", "swiglu_save", "swiglu_bwd")
#: The activations the template applies after the bias: name -> the ``approximate`` of F.gelu.
ACTIVATIONS = {"none": None, "gelu_tanh": "tanh", "gelu": "none"}


@dataclass(frozen=True, repr=False)
class GemmRequest:
    m: int
    n: int
    k: int
    dtype: str = "bf16"  # operand dtype
    out_dtype: str | None = None
    trans_a: bool = False  # A is a transposed view: memory holds A^T [K, M] row-major
    trans_b: bool = False  # memory holds B^T [N, K] row-major
    bias: bool = False
    batch: int = 1
    epilogue: str = "none"  # one of EPILOGUES
    residual: bool = False  # C = ... + R, R [M, N] of the operand dtype (arg ``r``), added in fp32 before the cast
    activation: str = "none"  # one of ACTIVATIONS, applied in fp32 after the bias, before the cast
    rope: int = 0  # head dim D of a RoPE epilogue (args cos, sin [P, D], scalar P), 0: none

    def __post_init__(self):
        if self.rope and (self.rope < 0 or self.rope % 2 or self.epilogue != "none" or self.residual
                          or self.activation != "none" or self.batch > 1):
            raise ValueError(f"gemm template: rope={self.rope} takes an even head dim, and no swiglu, residual, "
                             f"activation or batch; apply RoPE to the GEMM's output outside for those")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"gemm template: activation {self.activation!r} not served; use one of "
                             f"{', '.join(ACTIVATIONS)}")
        if self.activation != "none" and (self.residual or self.epilogue != "none"):
            raise ValueError("gemm template: an activation takes no residual and no swiglu epilogue; apply the "
                             "other part outside")
        if self.epilogue not in EPILOGUES:
            raise ValueError(f"gemm template: epilogue {self.epilogue!r} not served; use one of {', '.join(EPILOGUES)}")
        if self.epilogue in ("swiglu", "swiglu_save") and (self.bias or self.batch > 1):
            raise ValueError("gemm template: the swiglu epilogue takes no bias and batch=1; apply a bias to each "
                             "projection outside, or loop over the batch")
        if self.epilogue in ("swiglu", "swiglu_save") and self.residual:
            raise ValueError("gemm template: the swiglu epilogue takes no residual; add it to the result outside")
        if self.epilogue == "swiglu_bwd" and (self.bias or self.batch > 1 or self.residual or self.rope
                                              or self.activation != "none"):
            raise ValueError("gemm template: the swiglu_bwd epilogue takes no bias, residual, activation or RoPE "
                             "and batch=1; compute the gradients of those outside")
        if self.dtype not in ("bf16", "fp16"):
            raise ValueError(f"gemm template: dtype {self.dtype!r} not served; use bf16 or fp16")
        for d in ("m", "n", "k", "batch"):
            if getattr(self, d) < 1:
                raise ValueError(f"gemm template: {d} must be >= 1")

    def __repr__(self) -> str:
        # the dataclass form, with the epilogue, residual and activation only where set (names built from it stay
        # as they were)
        unset = {"epilogue": "none", "residual": False, "activation": "none", "rope": 0}
        fields = [f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self)
                  if f.name not in unset or getattr(self, f.name) != unset[f.name]]
        return f"GemmRequest({', '.join(fields)})"


def swap_reason(req: GemmRequest) -> str | None:
    """Why ``req`` cannot run swapped (``Options.swap_ab``), None where it can: the swapped tile serves
    ``act @ w.t() (+ bias)`` with ``act`` row-major and ``w`` [N, K] row-major (nn.Linear) only."""
    if req.trans_a or not req.trans_b:
        return (f"layout {'t' if req.trans_a else 'n'}{'t' if req.trans_b else 'n'}: a swap_ab tile reads A "
                f"row-major and B as a transposed view (nn.Linear's x @ w.t(), layout nt); use a config without "
                f"swap_ab or make the operands so")
    for what, unserved in (("batch > 1", req.batch > 1), ("a residual", req.residual), ("rope", req.rope > 0),
                           (f"the {req.epilogue} epilogue", req.epilogue in ("swiglu_bwd", "swiglu_save")),
                           (f"activation {req.activation!r}", req.activation != "none")):
        if unserved:
            return (f"{what}: a swap_ab tile stores the (biased) product or swiglu's only; use a config without "
                    f"swap_ab")
    return None


def _build_swapped(req: GemmRequest, opts: Options) -> Program:
    """The swap-AB Program (module docstring): a [BN, BM] tile of C^T, stored transposed into C."""
    why = swap_reason(req)
    if why:
        raise ValueError(f"gemm template: {why}")
    BM, BN, BK = opts.block_m, opts.block_n, opts.block_k
    dt, odt = req.dtype, req.out_dtype or req.dtype
    T = TileType
    swiglu = req.epilogue == "swiglu"
    weights = ("b", "bu") if swiglu else ("b",)  # [N, K] each: nn.Linear weights
    accs = ("acc", "acc_u") if swiglu else ("acc",)
    args = [Arg("a", "tensor", dt, ("M", "K")), *(Arg(w, "tensor", dt, ("N", "K")) for w in weights),
            Arg("c", "ptr", odt, ("M", "N"), out=True)]
    if req.bias:
        args.append(Arg("bias", "ptr", dt, ("N",)))
    args += [Arg("M", "scalar", "i32"), Arg("N", "scalar", "i32"), Arg("K", "scalar", "i32")]
    acc_t = T("f32", (BN, BM))
    tiles = {"b": "w", "bu": "wu"}  # the weight tiles' value names
    loop_body = [*(op("load", [Value(tiles[w], T(dt, (BN, BK), "smem"))], arg=w, coords=("pid_n*%d" % BN,
                                                                                         "k*%d" % BK))
                   for w in weights),
                 op("load", [Value("x", T(dt, (BM, BK), "smem"))], arg="a", coords=("pid_m*%d" % BM, "k*%d" % BK)),
                 op("trans", [Value("x_t", T(dt, (BK, BM), "smem"))], ["x"]),
                 *(op("mma", [Value(f"{x}_next", acc_t)], [tiles[w], "x_t", x]) for x, w in zip(accs, weights)),
                 op("yield", [], [f"{x}_next" for x in accs])]
    body = [*(op("zeros", [Value(f"{x}0", acc_t)]) for x in accs),
            op("loop", [Value(f"{x}_out", acc_t) for x in accs], [f"{x}0" for x in accs], loop_body, var="k", lb=0,
               ub="cdiv(K,%d)" % BK, iter_args=accs)]
    last = "acc_out"
    if swiglu:  # silu(gate) * up, in fp32, elementwise on the transposed tiles
        body += [op("silu", [Value("gate", acc_t)], ["acc_out"]),
                 op("mul", [Value("act", acc_t)], ["gate", "acc_u_out"])]
        last = "act"
    if req.bias:  # per N: per accumulator row
        body += [op("load_vec", [Value("bias_v", T("f32", (BN,)))], arg="bias", offset="pid_n*%d" % BN, size="N"),
                 op("expand", [Value("bias_col", T("f32", (BN, 1)))], ["bias_v"], axis=1),
                 op("add", [Value("acc_bias", acc_t)], [last, "bias_col"])]
        last = "acc_bias"
    body += [op("cast", [Value("out", T(odt, (BN, BM)))], [last]),
             op("store_ptr", [], ["out"], arg="c", row="pid_n*%d" % BN, col="pid_m*%d" % BM, ld="N",
                rows_valid="N-pid_n*%d" % BN, cols_valid="M-pid_m*%d" % BM, transposed=True)]
    name = f"gemm_{dt}_nt_{BM}x{BN}x{BK}_swap" + ("_bias" if req.bias else "") + ("_swiglu" if swiglu else "")
    grid = Grid((("pid_m", "cdiv(M,%d)" % BM), ("pid_n", "cdiv(N,%d)" % BN)), opts.persistent, opts.group_m,
                opts.serpentine)
    return Program(name, tuple(args), grid, opts, tuple(body), template="gemm")


def build(req: GemmRequest, opts: Options) -> Program:
    """The Program of one output tile [BM, BN]; K loop of cdiv(K, BK) steps with a carried accumulator
    (``opts.swap_ab``: the tile of C^T, module docstring)."""
    if opts.swap_ab:
        return _build_swapped(req, opts)
    BM, BN, BK = opts.block_m, opts.block_n, opts.block_k
    dt, odt = req.dtype, req.out_dtype or req.dtype
    batched = req.batch > 1
    # Row offsets of this tile; a batched GEMM flattens its batch into rows.
    row_a = "pid_b*M+pid_m*%d" % BM if batched else "pid_m*%d" % BM
    row_b = "pid_b*K+k*%d" % BK if batched else "k*%d" % BK
    col_b_t = "pid_b*N+pid_n*%d" % BN if batched else "pid_n*%d" % BN
    swiglu = req.epilogue in ("swiglu", "swiglu_save")
    save = req.epilogue == "swiglu_save"  # the projections too, in the output dtype (what a training graph saves)
    weights = ("b", "bu") if swiglu else ("b",)  # the up weight of swiglu is laid out as the gate weight b
    args = [Arg("a", "tensor", dt, ("K", "M") if req.trans_a else ("M", "K")),
            *(Arg(w, "tensor", dt, ("N", "K") if req.trans_b else ("K", "N")) for w in weights),
            Arg("c", "tensor", odt, ("M", "N"), out=True)]
    if req.bias:
        args.append(Arg("bias", "ptr", dt, ("N",)))
    swiglu_bwd = req.epilogue == "swiglu_bwd"
    tma_epi = opts.epilogue_tma and (req.residual or req.rope > 0 or swiglu_bwd)
    if swiglu_bwd and opts.split_k > 1:
        raise ValueError("gemm template: the swiglu_bwd epilogue with split_k > 1 is not built (its two stores of the "
                         "reduced sum); use a config without split_k")
    if opts.epilogue_chunk and not (swiglu_bwd or req.rope):
        raise ValueError("gemm template: epilogue_chunk is built for the swiglu_bwd and RoPE epilogues only (the "
                         "others fit a 256-wide tile's registers whole); use epilogue_chunk=0")
    if save and opts.split_k > 1:
        raise ValueError("gemm template: the swiglu_save epilogue with split_k > 1 is not built (three stores of the "
                         "reduced sums); use a config without split_k")
    if save:
        args += [Arg(t, "tensor", odt, ("M", "N"), out=True) for t in ("g", "u")]
    if swiglu_bwd:  # the second gradient (an output), then the forward's saved gate and up projections
        args += [Arg("du", "tensor", odt, ("M", "N"), out=True),
                 *(Arg(t, "tensor" if tma_epi else "ptr", dt, ("M", "N")) for t in ("g", "u"))]
    if tma_epi and opts.split_k > 1:
        raise ValueError("gemm template: epilogue_tma with split_k > 1: only the CTA that stores reads the epilogue's "
                         "operands, which the producers of every part would load; use pointer loads (epilogue_tma "
                         "False)")
    if req.residual:
        args.append(Arg("r", "tensor" if tma_epi else "ptr", dt, ("M", "N")))
    if req.rope:
        if BN % req.rope or (tma_epi and BN != req.rope and not opts.epilogue_chunk):
            raise ValueError(f"gemm template: rope={req.rope} needs tiles of whole heads (by TMA: of one head, or "
                             f"epilogue_chunk=D/2); "
                             f"block_n={BN} is not {'equal to' if tma_epi else 'a multiple of'} it")
        args += [Arg(t, "tensor" if tma_epi else "ptr", dt, ("P", str(req.rope))) for t in ("cos", "sin")]
    args += [Arg("M", "scalar", "i32"), Arg("N", "scalar", "i32"), Arg("K", "scalar", "i32")]
    if req.rope:
        args.append(Arg("P", "scalar", "i32"))

    T = TileType
    body = []
    if req.trans_a:
        # memory A^T [(batch*)K, M]: rows walk K, columns walk this tile's M range
        a_ops = [op("load", [Value("a_t", T(dt, (BK, BM), "smem"))], arg="a", coords=(row_b, "pid_m*%d" % BM)),
                 op("trans", [Value("a", T(dt, (BM, BK), "smem"))], ["a_t"])]
    else:
        a_ops = [op("load", [Value("a", T(dt, (BM, BK), "smem"))], arg="a", coords=(row_a, "k*%d" % BK))]
    b_ops = []
    for w in weights:
        if req.trans_b:
            b_ops += [op("load", [Value(f"{w}_t", T(dt, (BN, BK), "smem"))], arg=w, coords=(col_b_t, "k*%d" % BK)),
                      op("trans", [Value(w, T(dt, (BK, BN), "smem"))], [f"{w}_t"])]
        else:
            b_ops.append(op("load", [Value(w, T(dt, (BK, BN), "smem"))], arg=w, coords=(row_b, "pid_n*%d" % BN)))
    acc_t = T("f32", (BM, BN))
    accs = ("acc", "acc_u") if swiglu else ("acc",)  # one accumulator per weight, each from zeros
    body += [op("zeros", [Value(f"{x}0", acc_t)]) for x in accs]
    loop_body = [*a_ops, *b_ops,
                 *(op("mma", [Value(f"{x}_next", acc_t)], ["a", w, x]) for x, w in zip(accs, weights)),
                 op("yield", [], [f"{x}_next" for x in accs])]
    body.append(op("loop", [Value(f"{x}_out", acc_t) for x in accs], [f"{x}0" for x in accs], loop_body, var="k",
                   lb=0, ub="cdiv(K,%d)" % BK, iter_args=accs))
    last = "acc_out"
    if save:  # the projections as the GEMMs alone would write them: one rounding of each sum
        for x, t in (("acc_out", "g"), ("acc_u_out", "u")):
            body += [op("cast", [Value(f"{t}_out", T(odt, (BM, BN)))], [x]),
                     op("store", [], [f"{t}_out"], arg=t, coords=("pid_m*%d" % BM, "pid_n*%d" % BN))]
    if swiglu:  # silu(gate) * up, in fp32
        body += [op("silu", [Value("gate", acc_t)], ["acc_out"]),
                 op("mul", [Value("act", acc_t)], ["gate", "acc_u_out"])]
        last = "act"
    if req.bias:
        body += [op("load_vec", [Value("bias_v", T("f32", (BN,)))], arg="bias", offset="pid_n*%d" % BN, size="N"),
                 op("expand", [Value("bias_row", T("f32", (1, BN)))], ["bias_v"], axis=0),
                 op("add", [Value("acc_bias", acc_t)], [last, "bias_row"])]
        last = "acc_bias"
    if req.activation != "none":  # after the bias, in fp32
        body.append(op("gelu", [Value("acc_act", acc_t)], [last], approximate=ACTIVATIONS[req.activation]))
        last = "acc_act"
    if req.rope and opts.epilogue_chunk:  # the same, in half-head column chunks of a tile of several heads
        body += rope_chunks(last, BM, BN, req.rope, opts.epilogue_chunk, dt, odt, tma_epi)
        last = None  # every chunk stored
    elif req.rope:  # x * cos + rotate_half(x) * sin per head, the tables' rows m % P and columns n % D, in fp32
        D = req.rope
        if tma_epi:  # rows (m0 % P) + r: whole tiles of rows inside the table (the runtime's P % BM == 0, or P >= M)
            for t in ("cos", "sin"):
                body += tma_operand_tile(t, f"{t}_tile", ("(pid_m*%d)%%P" % BM, "0"), dt, (BM, BN))
        else:
            body += [op("load_ptr", [Value(f"{t}_tile", acc_t)], arg=t, row=row_a, col="0", ld=str(D),
                        rows_valid="M-pid_m*%d" % BM, cols_valid="N-pid_n*%d" % BN, row_mod="P", col_mod=str(D))
                     for t in ("cos", "sin")]
        body += [op("rotate_half", [Value("acc_rot", acc_t)], [last], width=D),
                 op("mul", [Value("acc_cos", acc_t)], [last, "cos_tile"]),
                 op("mul", [Value("acc_sin", acc_t)], ["acc_rot", "sin_tile"]),
                 op("add", [Value("acc_rope", acc_t)], ["acc_cos", "acc_sin"])]
        last = "acc_rope"
    if swiglu_bwd:  # du = dh silu(G) and dG = dh silu'(G) U, both stored (swiglu_bwd_grads); all in fp32
        def saved_tile(t):  # a saved projection's tile, masked at the ragged edges, in fp32
            if tma_epi:
                return tma_operand_tile(t, f"{t}_tile", ("pid_m*%d" % BM, "pid_n*%d" % BN), dt, (BM, BN)), f"{t}_tile"
            return [op("load_ptr", [Value(f"{t}_tile", acc_t)], arg=t, row="pid_m*%d" % BM, col="pid_n*%d" % BN,
                       ld="N", rows_valid="M-pid_m*%d" % BM, cols_valid="N-pid_n*%d" % BN)], f"{t}_tile"

        chunk = opts.epilogue_chunk
        if chunk and chunk != BN:
            body += swiglu_bwd_chunks(last, BM, BN, chunk, dt, odt, tma_epi)
        else:
            body += swiglu_bwd_grads(last, saved_tile, "", (BM, BN), odt, ("pid_m*%d" % BM, "pid_n*%d" % BN))
        last = None  # both outputs stored
    if req.residual:  # R's tile, masked at the ragged edges, in fp32 (the rows of c: a batch's rows follow its own)
        if tma_epi:
            body += tma_operand_tile("r", "res", (row_a, "pid_n*%d" % BN), dt, (BM, BN))
        else:
            body.append(op("load_ptr", [Value("res", acc_t)], arg="r", row=row_a, col="pid_n*%d" % BN, ld="N",
                           rows_valid="M-pid_m*%d" % BM, cols_valid="N-pid_n*%d" % BN))
        body.append(op("add", [Value("acc_res", acc_t)], [last, "res"]))
        last = "acc_res"
    if last is not None:
        body += [op("cast", [Value("out", T(odt, (BM, BN)))], [last]),
                 op("store", [], ["out"], arg="c", coords=(row_a if batched else "pid_m*%d" % BM, "pid_n*%d" % BN))]

    if opts.epilogue_prefetch:
        if not tma_epi:
            raise ValueError("gemm template: epilogue_prefetch moves the epilogue's TMA loads before the K loop; it "
                             "needs epilogue_tma=True and an epilogue operand (residual, RoPE, swiglu_bwd)")
        body = prefetched(body)

    tiles = [("pid_m", "cdiv(M,%d)" % BM), ("pid_n", "cdiv(N,%d)" % BN)]
    if batched:
        tiles.insert(0, ("pid_b", str(req.batch)))
    name = f"gemm_{dt}_{'t' if req.trans_a else 'n'}{'t' if req.trans_b else 'n'}_{BM}x{BN}x{BK}"
    if req.bias:
        name += "_bias"
    if req.activation != "none":
        name += "_" + req.activation
    if req.residual:
        name += "_res"
    if req.rope:
        name += f"_rope{req.rope}"
    if batched:
        name += "_batched"
    if swiglu:
        name += "_swiglu"
    if save:
        name += "_save"
    if swiglu_bwd:
        name += "_swiglu_bwd"
    grid = Grid(tuple(tiles), opts.persistent, opts.group_m, opts.serpentine)
    return Program(name, tuple(args), grid, opts, tuple(body), template="gemm")
