"""Gluon builtins that triton 3.6's Gluon lacks for Hopper, which generated kernels import.

``async_reduce_add_shared_to_global(desc, coord, src)``: a TMA bulk reduce-add of an SMEM tile into global memory
through a tensor descriptor (PTX ``cp.reduce.async.bulk.tensor.<n>d.global.shared::cta.add``). Gluon 3.6's Hopper
``tma`` module exports the plain copies (``async_copy_shared_to_global``) and ``store_wait`` but no reduce, while
its op builder has ``create_async_tma_reduce`` (the Blackwell module uses it); this is the same call as
``tma.async_copy_shared_to_global`` with the reduce kind ADD. Like the plain TMA store it is asynchronous and
counted by ``tma.store_wait``: the SMEM tile may be overwritten only after ``tma.store_wait`` says the reduce has
read it, and the writes into it from registers must be made visible to the async proxy first
(``fence_async_shared``). The attention backward's "reduce" dQ form (FlashAttention-3's dQ accumulation, passes/
BACKWARD.md) is its user: codegen/sm90.py's ``tma_reduce_add`` emitter.

When a triton release exports an equivalent (e.g. ``tma.async_reduce_shared_to_global``), use it and drop this.
"""
from __future__ import annotations

from triton._C.libtriton import ir
from triton.experimental.gluon.language._core import builtin

__all__ = ["async_reduce_add_shared_to_global", "bulk_wait_read_only"]


@builtin
def async_reduce_add_shared_to_global(tensor_desc, coord, src, _semantic=None):
    """Add the SMEM tile ``src`` element-wise into ``tensor_desc``'s tensor at ``coord`` (a TMA bulk reduce-add:
    asynchronous, clipped at the tensor's bounds as a TMA store is; wait for it with ``tma.store_wait``)."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle)


@builtin
def bulk_wait_read_only(_semantic=None):
    """``cp.async.bulk.wait_group.read 0`` alone: the issuing thread waits until its TMA stores and reduces have read
    their SMEM. ``tma.store_wait(0)`` is the same instruction plus a partition-wide bar.sync (Triton's barrier
    analysis puts one after every wait), which tells the other threads; this leaves that to a bar.sync the kernel
    has anyway between the wait and the next write into the tile (``Options.early_reduce_wait``)."""
    b = _semantic.builder  # one dummy result: Triton lowers inline asm with results only; not pure, so it stays
    b.create_inline_asm("cp.async.bulk.wait_group.read 0;\n\tmov.u32 $0, 0;", "=r", [], [b.get_int32_ty()], False, 1)
