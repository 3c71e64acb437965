"""The GEMM template's epilogue pieces that take more than a few ops (templates.gemm ``build`` calls them): an operand
tile by TMA, the hoisting of the epilogue's loads before the K loop (``Options.epilogue_prefetch``), the SwiGLU
backward's gradients, and the epilogues in column chunks (``Options.epilogue_chunk``) of the SwiGLU backward and of
RoPE, which let a 256-wide tile's fp32 temporaries take a chunk's registers beside the accumulator."""
from __future__ import annotations

from ..ir import TileType, Value, op


def tma_operand_tile(arg: str, name: str, coords: tuple[str, str], dt: str, shape: tuple[int, int]) -> list:
    """An epilogue operand tile by TMA (``Options.epilogue_tma``): the producer loads it into SMEM (out-of-bounds
    rows and columns read as zeros), the consumer reads it into registers and widens it to fp32 as ``name``."""
    return [op("load", [Value(f"{name}_s", TileType(dt, shape, "smem"))], arg=arg, coords=coords),
            op("smem_read", [Value(f"{name}_m", TileType(dt, shape))], [f"{name}_s"]),
            op("cast", [Value(name, TileType("f32", shape))], [f"{name}_m"])]


def prefetched(body: list) -> list:
    """``body`` with the epilogue's TMA loads (``load`` ops after the K loop) moved before it (``Options.
    epilogue_prefetch``): the producer issues them at the tile's start; the consumers' reads stay after the loop."""
    i = next(i for i, o in enumerate(body) if o.kind == "loop")
    late = [o for o in body[i + 1:] if o.kind == "load"]
    moved = {id(o) for o in late}
    return body[:i] + late + [o for o in body[i:] if id(o) not in moved]


def swiglu_bwd_grads(dh: str, read, k: str, shape: tuple[int, int], odt: str, coords: tuple[str, str]) -> list:
    """The SwiGLU backward's gradients of one tile (or one column chunk of it: value names end in ``k``) from the
    accumulator values ``dh``, in fp32: ``du = dh silu(G)`` stored as ``du``, ``dG = dh silu'(G) U`` stored as ``c``,
    both at ``coords``. ``read(t)`` gives (the ops that make saved projection t's fp32 values, their name). In this
    order, so that G, dh and U are never all live beside the products (registers): both uses of G (and dh) before
    du's store, U after it."""
    ct = TileType("f32", shape)
    (g_ops, g), (u_ops, u) = read("g"), read("u")
    return [*g_ops,
            op("sigmoid", [Value(f"sig_g{k}", ct)], [g]),
            op("mul", [Value(f"silu_g{k}", ct)], [g, f"sig_g{k}"]),
            op("mul", [Value(f"d_up{k}", ct)], [dh, f"silu_g{k}"]),
            op("silu_grad", [Value(f"dsilu_g{k}", ct)], [g, f"sig_g{k}"]),
            op("mul", [Value(f"d_act{k}", ct)], [dh, f"dsilu_g{k}"]),
            op("cast", [Value(f"du_out{k}", TileType(odt, shape))], [f"d_up{k}"]),
            op("store", [], [f"du_out{k}"], arg="du", coords=coords),
            *u_ops,
            op("mul", [Value(f"d_gate{k}", ct)], [f"d_act{k}", u]),
            op("cast", [Value(f"out{k}", TileType(odt, shape))], [f"d_gate{k}"]),
            op("store", [], [f"out{k}"], arg="c", coords=coords)]


def swiglu_bwd_chunks(dh: str, BM: int, BN: int, chunk: int, dt: str, odt: str, tma_epi: bool) -> list:
    """The SwiGLU backward's epilogue in column chunks (``Options.epilogue_chunk``): the accumulator ``dh`` split into
    BN/chunk register chunks (col_split), G's and U's TMA-loaded tiles read a chunk at a time through column slices of
    their SMEM tiles, and each chunk's du and dG stored at once (TMA stores of [BM, chunk] tiles, staged in the slices
    of G and U just read: passes/buffers). A 256-wide tile's fp32 temporaries then take a chunk's registers beside
    the accumulator instead of a whole tile's (which spilled)."""
    n = BN // chunk
    T = TileType
    ct = T("f32", (BM, chunk))
    # G's and U's whole tiles by TMA (their loads alone: each chunk reads a column slice of them)
    body = [*tma_operand_tile("g", "g_tile", ("pid_m*%d" % BM, "pid_n*%d" % BN), dt, (BM, BN))[:1],
            *tma_operand_tile("u", "u_tile", ("pid_m*%d" % BM, "pid_n*%d" % BN), dt, (BM, BN))[:1],
            _col_split(dh, BM, BN, chunk, tma_epi, "G's and U's chunks")]
    for i in range(n):
        k = f"_k{i}"

        def read(t, k=k, i=i):  # chunk i of the saved projection t's SMEM tile, in fp32
            return [op("slice", [Value(f"{t}_s{k}", T(dt, (BM, chunk), "smem"))], [f"{t}_tile_s"], start=i * chunk,
                       size=chunk),
                    op("smem_read", [Value(f"{t}_m{k}", T(dt, (BM, chunk)))], [f"{t}_s{k}"]),
                    op("cast", [Value(f"{t}{k}", ct)], [f"{t}_m{k}"])], f"{t}{k}"

        body += swiglu_bwd_grads(f"{dh}{k}", read, k, (BM, chunk), odt, ("pid_m*%d" % BM, _col(BN, i * chunk)))
    return body


def rope_chunks(acc: str, BM: int, BN: int, D: int, chunk: int, dt: str, odt: str, tma_epi: bool) -> list:
    """RoPE's epilogue in half-head column chunks (``Options.epilogue_chunk`` = D/2) of a tile of BN/D heads: the
    accumulator split into 2·BN/D register chunks (col_split), so head h's halves x1, x2 are chunks 2h and 2h+1 and
    ``rotate_half`` needs no op (out1 = x1 cos1 - x2 sin1, out2 = x2 cos2 + x1 sin2, cos_i / sin_i the tables'
    column halves: slices of their TMA tiles, one [BM, D] tile each for all the tile's heads), each chunk stored at
    once by a TMA store of [BM, D/2]. A 256-wide tile's fp32 temporaries are then a chunk's beside the accumulator."""
    if D != 2 * chunk:
        raise ValueError(f"gemm template: RoPE in chunks takes epilogue_chunk = D/2 = {D // 2}; got {chunk}")
    n = BN // chunk
    T = TileType
    ct = T("f32", (BM, chunk))
    # the tables' tiles by TMA (their loads alone: each chunk reads a column half of them)
    body = [tma_operand_tile(t, f"{t}_tile", ("(pid_m*%d)%%P" % BM, "0"), dt, (BM, D))[0] for t in ("cos", "sin")]
    body.append(_col_split(acc, BM, BN, chunk, tma_epi, "the tables' column halves"))
    for t in ("cos", "sin"):
        for half in range(2):
            body += [op("slice", [Value(f"{t}_s{half}", T(dt, (BM, chunk), "smem"))], [f"{t}_tile_s"],
                        start=half * chunk, size=chunk)]
    for h in range(n // 2):
        x1, x2 = f"{acc}_k{2 * h}", f"{acc}_k{2 * h + 1}"
        for half, (a, b, sign) in enumerate(((x1, x2, "sub"), (x2, x1, "add"))):
            k = f"_h{h}_{half}"
            for t in ("cos", "sin"):  # the tables' half, read where it is used (registers for one chunk at a time)
                body += [op("smem_read", [Value(f"{t}_m{k}", T(dt, (BM, chunk)))], [f"{t}_s{half}"]),
                         op("cast", [Value(f"{t}{k}", ct)], [f"{t}_m{k}"])]
            col = _col(BN, (2 * h + half) * chunk)
            body += [op("mul", [Value(f"rc{k}", ct)], [a, f"cos{k}"]),
                     op("mul", [Value(f"rs{k}", ct)], [b, f"sin{k}"]),
                     op(sign, [Value(f"rope{k}", ct)], [f"rc{k}", f"rs{k}"]),
                     op("cast", [Value(f"out{k}", T(odt, (BM, chunk)))], [f"rope{k}"]),
                     op("store", [], [f"out{k}"], arg="c", coords=("pid_m*%d" % BM, col))]
    return body


def _col_split(acc: str, BM: int, BN: int, chunk: int, tma_epi: bool, reads: str):
    """The ``col_split`` of the accumulator ``acc`` into BN/chunk register chunks, after the checks every chunked
    epilogue needs: a power of two of chunks of a multiple of 16 columns, and its operand tiles (``reads``, read through
    column slices) by TMA."""
    n = BN // chunk
    if BN % chunk or n & (n - 1) or chunk % 16:
        raise ValueError(f"gemm template: epilogue_chunk={chunk} must split block_n={BN} into a power of two of "
                         f"chunks of a multiple of 16 columns; use 0 (the whole tile) or such a width")
    if not tma_epi:
        raise ValueError(f"gemm template: epilogue_chunk reads {reads} through column slices of their TMA tiles; it "
                         f"needs epilogue_tma=True")
    return op("col_split", [Value(f"{acc}_k{i}", TileType("f32", (BM, chunk))) for i in range(n)], [acc])


def _col(BN: int, offset: int) -> str:
    """The column coordinate of a chunk ``offset`` columns into this tile."""
    return "pid_n*%d+%d" % (BN, offset) if offset else "pid_n*%d" % BN
