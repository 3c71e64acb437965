"""GEMM template: C[M, N] (+ bias[N]) = A[M, K] @ B[K, N], optional batch, fp32 accumulation.

A and B may each be row-major or a transposed view (column-major): the Arg describes memory, and a
``trans`` op turns the loaded [BK, BM] (or [BN, BK]) tile into the logical one, a free SMEM view
that wgmma reads directly. Batched GEMMs add a tile index ``pid_b``; the tensors are then 2-D views
of the batch flattened into rows (the runtime checks that tiles never straddle two batches).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ir import Arg, Grid, Options, Program, TileType, Value, op


@dataclass(frozen=True)
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

    def __post_init__(self):
        if self.dtype not in ("bf16", "fp16"):
            raise ValueError(f"gemm template: dtype {self.dtype!r} not served; use bf16 or fp16")
        for d in ("m", "n", "k", "batch"):
            if getattr(self, d) < 1:
                raise ValueError(f"gemm template: {d} must be >= 1")


def build(req: GemmRequest, opts: Options) -> Program:
    """The Program of one output tile [BM, BN]; K loop of cdiv(K, BK) steps with a carried accumulator."""
    BM, BN, BK = opts.block_m, opts.block_n, opts.block_k
    dt, odt = req.dtype, req.out_dtype or req.dtype
    batched = req.batch > 1
    # Row offsets of this tile; a batched GEMM flattens its batch into rows.
    row_a = "pid_b*M+pid_m*%d" % BM if batched else "pid_m*%d" % BM
    row_b = "pid_b*K+k*%d" % BK if batched else "k*%d" % BK
    col_b_t = "pid_b*N+pid_n*%d" % BN if batched else "pid_n*%d" % BN
    args = [
        Arg("a", "tensor", dt, ("K", "M") if req.trans_a else ("M", "K")),
        Arg("b", "tensor", dt, ("N", "K") if req.trans_b else ("K", "N")),
        Arg("c", "tensor", odt, ("M", "N"), out=True),
    ]
    if req.bias:
        args.append(Arg("bias", "ptr", dt, ("N",)))
    args += [Arg("M", "scalar", "i32"), Arg("N", "scalar", "i32"), Arg("K", "scalar", "i32")]

    T = TileType
    body = []
    if req.trans_a:
        # memory A^T [(batch*)K, M]: rows walk K, columns walk this tile's M range
        a_ops = [op("load", [Value("a_t", T(dt, (BK, BM), "smem"))], arg="a", coords=(row_b, "pid_m*%d" % BM)),
                 op("trans", [Value("a", T(dt, (BM, BK), "smem"))], ["a_t"])]
    else:
        a_ops = [op("load", [Value("a", T(dt, (BM, BK), "smem"))], arg="a", coords=(row_a, "k*%d" % BK))]
    if req.trans_b:
        b_ops = [op("load", [Value("b_t", T(dt, (BN, BK), "smem"))], arg="b", coords=(col_b_t, "k*%d" % BK)),
                 op("trans", [Value("b", T(dt, (BK, BN), "smem"))], ["b_t"])]
    else:
        b_ops = [op("load", [Value("b", T(dt, (BK, BN), "smem"))], arg="b", coords=(row_b, "pid_n*%d" % BN))]
    acc_t = T("f32", (BM, BN))
    body.append(op("zeros", [Value("acc0", acc_t)]))
    loop_body = [*a_ops, *b_ops,
                 op("mma", [Value("acc_next", acc_t)], ["a", "b", "acc"]),
                 op("yield", [], ["acc_next"])]
    body.append(op("loop", [Value("acc_out", acc_t)], ["acc0"], loop_body, var="k", lb=0, ub="cdiv(K,%d)" % BK,
                   iter_args=("acc",)))
    last = "acc_out"
    if req.bias:
        body += [op("load_vec", [Value("bias_v", T("f32", (BN,)))], arg="bias", offset="pid_n*%d" % BN, size="N"),
                 op("expand", [Value("bias_row", T("f32", (1, BN)))], ["bias_v"], axis=0),
                 op("add", [Value("acc_bias", acc_t)], [last, "bias_row"])]
        last = "acc_bias"
    body += [op("cast", [Value("out", T(odt, (BM, BN)))], [last]),
             op("store", [], ["out"], arg="c", coords=(row_a if batched else "pid_m*%d" % BM, "pid_n*%d" % BN))]

    tiles = [("pid_m", "cdiv(M,%d)" % BM), ("pid_n", "cdiv(N,%d)" % BN)]
    if batched:
        tiles.insert(0, ("pid_b", str(req.batch)))
    name = f"gemm_{dt}_{'t' if req.trans_a else 'n'}{'t' if req.trans_b else 'n'}_{BM}x{BN}x{BK}"
    if req.bias:
        name += "_bias"
    if batched:
        name += "_batched"
    grid = Grid(tuple(tiles), opts.persistent, opts.group_m, opts.serpentine)
    return Program(name, tuple(args), grid, opts, tuple(body))
