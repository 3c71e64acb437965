"""The attention score mask's emitter (``mask``: key length, query length, causal; either frame) and
``mask_guard``, the uniform condition under which a block needs it (``Options.skip_mask`` skips the rest)."""
from __future__ import annotations

from .context import expr, v
from .emit_base import emitter


def mask_guard(o, bm: int, bn: int) -> str:
    """A uniform condition, true for every block the mask can change: the block crosses the key
    length (``col + bn > kv_len``), the query length if given, or, causal, the diagonal (its last key is
    past its first query). Every other block keeps all of its scores, so the mask is skipped there.
    ``keys_on_rows`` (the transposed frame): keys are rows from ``row``, queries columns from ``col``."""
    row, col, kv = expr(o.attr("row")), expr(o.attr("col")), expr(o.attr("kv_len"))
    (k0, nk), (q0, nq) = ((row, bm), (col, bn)) if o.attr("keys_on_rows") else ((col, bn), (row, bm))
    cond = f"({k0} + {nk} > {kv})"
    if o.attr("q_len") is not None:
        cond += f" | ({q0} + {nq} > {expr(o.attr('q_len'))})"
    if o.attr("causal"):
        cond += f" | ({k0} + {nk - 1} > {q0})"
    return cond


def _mask_keep(ctx, o, L: str, bm: int, bn: int) -> tuple[list[str], str]:
    """(lines, keep condition) of the general mask: key < kv_len, query < q_len (if given), causal key <= query,
    in either frame (``keys_on_rows``)."""
    n = v(o.results[0].name)
    lines = [f"{n}_r = {expr(o.attr('row'))} + gl.arange(0, {bm}, layout={ctx._slice(1, L)})",
             f"{n}_c = {expr(o.attr('col'))} + gl.arange(0, {bn}, layout={ctx._slice(0, L)})"]
    keys, queries = (f"{n}_r[:, None]", f"{n}_c[None, :]") if o.attr("keys_on_rows") else \
        (f"{n}_c[None, :]", f"{n}_r[:, None]")
    keep = [f"({keys} < {expr(o.attr('kv_len'))})"]
    if o.attr("q_len") is not None:
        keep.append(f"({queries} < {expr(o.attr('q_len'))})")
    if o.attr("causal"):
        keep.append(f"({keys} <= {queries})")
    return lines, " & ".join(keep)


@emitter("mask")
def _mask(ctx, o, indent):
    r = o.results[0]
    L = ctx.layouts[r.name]
    bm, bn = r.type.shape
    x, lim = v(r.name), f"{v(r.name)}_lim"
    if o.attr("keys_on_rows") or o.attr("q_len") is not None:
        body, keep = _mask_keep(ctx, o, L, bm, bn)
        body.append(f"{x} = gl.where({keep}, {v(o.operands[0])}, float(\"-inf\"))")
        if not ctx.program.options.skip_mask:
            return body
        return [f"{x} = {v(o.operands[0])}", f"if {mask_guard(o, bm, bn)}:"] + ["    " + ln for ln in body]
    # one compare per score: column c of the block is kept iff c < limit of its row
    kv = expr(o.attr("kv_len"))
    body = []
    if o.attr("causal"):  # top-left causal: key <= query, and key < kv_len
        body.append(f"{lim} = gl.minimum({expr(o.attr('row'))} + 1 + gl.arange(0, {bm}, layout={ctx._slice(1, L)}), "
                    f"{kv}) - {expr(o.attr('col'))}")
        keep = f"gl.arange(0, {bn}, layout={ctx._slice(0, L)})[None, :] < {lim}[:, None]"
    else:
        body.append(f"{lim} = {kv} - {expr(o.attr('col'))}")
        keep = f"gl.arange(0, {bn}, layout={ctx._slice(0, L)})[None, :] < {lim}"
    body.append(f"{x} = gl.where({keep}, {v(o.operands[0])}, float(\"-inf\"))")
    if not ctx.program.options.skip_mask:
        return body
    # only blocks on the diagonal or the key tail are masked (a uniform branch; the rest skip the ALU work)
    return [f"{x} = {v(o.operands[0])}", f"if {mask_guard(o, bm, bn)}:"] + ["    " + ln for ln in body]
