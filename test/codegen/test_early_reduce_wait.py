"""``Options.early_reduce_wait`` (codegen/sm90.py ``_smem_store``, ``_tma_reduce_add``): a partition that adds a staged
tile into memory waits for its previous reduce before the step's ``smem_store`` with the bare bulk wait
(``gluon_ext.bulk_wait_read_only``) instead of ``tma.store_wait`` right before the staging store. The generated order
(wait, dS^T store, fence, the wgmma that reads it, then the staging store and the reduce with no wait between), the
sm_90a PTX (the bar.sync that precedes dQ's wgmma lies between the wait and the staging store; one bar.sync a step
fewer per consumer), and the refusal where no smem_store precedes the reduce. The IR is unchanged (the
interpreter's runs stand); the H200's verdict: bench/results/sweeps/2026-12-02-h200-attention-bwd-erw.json."""
from __future__ import annotations

import dataclasses
import re

import pytest
from programs import assert_in_order

from torch_autows.codegen import gluon
from torch_autows.codegen.compile import compile_offline
from torch_autows.ir import format_program
from torch_autows.passes import pipeline
from torch_autows.runtime.attention_bwd import CONFIGS
from torch_autows.templates.attention_bwd import AttentionBwdRequest, build

PICKS = [("bwd_64x64_dp1_c2", 64, True), ("bwd_64x128_dp2_dqsplit_fold", 128, False)]


def _program(config: str, d: int, causal: bool, early: bool):
    opts = dataclasses.replace(CONFIGS[config], early_reduce_wait=early)
    return pipeline.run(build(AttentionBwdRequest(d, "bf16", causal, dq="reduce"), opts))


def _consumer(src: str) -> str:
    start = src.index("def consumer0(")
    return src[start:src.index("\ndef ", start + 1)]


def test_the_picks_take_it():
    assert all(CONFIGS[c].early_reduce_wait for c, _, _ in PICKS)


@pytest.mark.parametrize("config,d,causal", PICKS)
def test_wait_moves_before_the_step_smem_store(config, d, causal):
    late, early = (_consumer(gluon.generate(_program(config, d, causal, e))) for e in (False, True))
    assert "bulk_wait_read_only()" not in late and "tma.store_wait(0)  # the previous TMA reduce" in late
    step = early[early.index("for j in range("):]
    assert "tma.store_wait(0)  # the previous TMA reduce" not in step
    assert_in_order(step, ["bulk_wait_read_only()", " = dss_", ".store(", "fence_async_shared()", "warpgroup_mma(",
                           "_stage", ".store(", "fence_async_shared()", "async_reduce_add_shared_to_global("])
    # codegen only: the IR after every pass is the same but for the option's own line
    a, b = (format_program(_program(config, d, causal, e)) for e in (False, True))
    assert "early_reduce_wait=True" in b and b.replace(" early_reduce_wait=True", "") == a


def _bars(ptx: str) -> list[int]:
    return [m.start() for m in re.finditer(r"\b(bar|barrier)\.sync\b", ptx)]


@pytest.mark.parametrize("config,d,causal", PICKS)
def test_sm90a_has_a_bar_sync_between_the_wait_and_the_staging_store(config, d, causal):
    ptx = {e: compile_offline(_program(config, d, causal, e)).asm["ptx"] for e in (False, True)}
    consumers = 2 if CONFIGS[config].data_partition == 2 else 1
    assert len(_bars(ptx[True])) == len(_bars(ptx[False])) - consumers
    text = ptx[True]
    for wait in (m.start() for m in re.finditer(r"cp\.async\.bulk\.wait_group\.read 0;\n\tmov\.u32", text)):
        reduce = text.index("cp.reduce.async.bulk.tensor", wait)
        staging = text.rfind("fence.proxy.async", wait, reduce)
        assert any(wait < b < staging for b in _bars(text)), "no bar.sync orders the wait before the staging store"


def _reduce_first(body: tuple) -> tuple:
    """``body`` with a loop body's tma_reduce_add moved before its first smem_store (a program codegen must refuse
    under early_reduce_wait: no bar.sync after the moved wait would precede the staging store)."""
    out = [dataclasses.replace(o, body=_reduce_first(o.body)) if o.body else o for o in body]
    kinds = [o.kind for o in out]
    if "smem_store" in kinds and "tma_reduce_add" in kinds:
        red = out.pop(kinds.index("tma_reduce_add"))
        out.insert(kinds.index("smem_store"), red)
    return tuple(out)


def test_refused_without_an_smem_store_before_the_reduce():
    program = _program("bwd_64x64_dp1_c2", 64, False, True)
    bad = dataclasses.replace(program, partitions=tuple(dataclasses.replace(p, body=_reduce_first(p.body))
                                                        for p in program.partitions))
    with pytest.raises(ValueError, match="early_reduce_wait, but no smem_store precedes the reduce"):
        gluon.generate(bad)
    # without a reduce there is nothing to move: the GEMM's code is the same with the option
    from torch_autows.runtime.gemm import CONFIGS as GEMM
    from torch_autows.templates.gemm import GemmRequest
    from torch_autows.templates.gemm import build as build_gemm

    base = next(iter(GEMM.values()))
    a, b = (gluon.generate(pipeline.run(build_gemm(GemmRequest(256, 256, 256), dataclasses.replace(
        base, early_reduce_wait=e)))) for e in (False, True))
    assert "bulk_wait_read_only" not in b and a == b
