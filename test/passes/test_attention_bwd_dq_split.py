"""The attention backward's reduce form with FA3's split dQ (``Options.dq_split``, passes/BACKWARD.md §4 step 8 (b)):
data_partition makes the two consumer chains share their dS^T tiles through SMEM (one ``chain_sync`` a step) and
chain c computes dQ^T's head-dim rows c*D/2.. over all keys (``trans(slice(K_x)) @ dS_x`` for both chains x, the other
chain's tile through ``smem_view``), reduced transposed at column c*D/2. Where D/2 is under wgmma's 64 (d=64) and
the query step BM/2 is not, chain c computes dQ's query rows c*BM/2.. instead (``trans(slice(dS_x)) @ K_x``), reduced
at row c*BM/2. Verified after every stage, interpreted under every policy against torch, and the mutations the
checkers must catch: the meeting removed, the K (or dS) slice at the wrong columns, a dS tile rewritten while the
other chain may still read it (one copy)."""
from __future__ import annotations

from dataclasses import replace

import pytest
from programs import violation_kinds

from torch_autows.interp import interpret_report
from torch_autows.ir import Options, walk
from torch_autows.passes import PassError, pipeline
from torch_autows.templates.attention_bwd import AttentionBwdRequest, build
from torch_autows.verify import VerifyError, check

SHAPE = (1, 2, 1, 100, 190)  # batch, q heads, kv heads, Sq, Skv: several Q blocks a head, two KV blocks, ragged


def _opts(split=True, bm=32, fold=False):
    return Options(block_m=bm, block_n=128, stages=2, data_partition=2, dq_split=split, producer_regs=24,
                   fold_rows=fold)


def _split(causal=False, dt="bf16", d=128, bm=32, fold=False):
    return build(AttentionBwdRequest(d, dt, causal, dq="reduce"), _opts(bm=bm, fold=fold))


def _map(p, fn):
    """``p`` with ``fn`` applied to every op of every partition (bodies first)."""
    def rw(ops):
        out = []
        for o in ops:
            if o.body:
                o = replace(o, body=rw(o.body))
            o = fn(o)
            if o is not None:
                out.append(o)
        return tuple(out)

    return replace(p, partitions=tuple(replace(pt, body=rw(pt.body)) for pt in p.partitions))


@pytest.mark.parametrize("causal,bm,fold", [(False, 32, False), (True, 32, False), (False, 64, True),
                                          (True, 64, True)])
def test_every_policy_and_seed_matches_torch(causal, bm, fold):
    """d=128, BM 32 (``bwd_32x128_dp2_dqsplit``) and BM 64 with lse2/delta folded into the accumulators
    (``bwd_64x128_dp2_dqsplit_fold``): verified after every stage; every policy x 2 seeds (ragged lengths, GQA,
    causal with Sq <, =, > Skv) gives the padded dQ workspace, dK and dV of the math backward."""
    before = _split(causal, bm=bm, fold=fold)
    after = pipeline.run(before, verify=True, dump_dir="")
    ok, report = interpret_report(before, after, seeds=2)
    assert ok, report


def test_the_chains_share_ds_and_split_dq_by_head_dim_columns():
    """Each consumer: its dS store, one meeting, two dQ^T wgmmas (the own tile and a view of the other's, K column
    slice c*64), one transposed reduce at column c*64 from a [32, 64] staging tile; dS tiles in two copies, no ring for
    them; SMEM as the probe's (BACKWARD.md: 131568 with the probe's barriers) and the producer's lse2/delta rows
    (two [1, 32] f32 tiles, 2 copies each, 1024-byte aligned: 1600 bytes)."""
    p = pipeline.run(_split(), dump_dir="")
    for c in (0, 1):
        ops = [o for o in walk(p.partition(f"consumer{c}").body)]
        kinds = [o.kind for o in ops if o.kind in ("smem_store", "chain_sync", "smem_view", "tma_reduce_add")]
        assert kinds == ["smem_store", "chain_sync", "smem_view", "tma_reduce_add"]
        assert [o.attr("start") for o in ops if o.kind == "slice"] == [c * 64, c * 64]
        mmas = [o for o in ops if o.kind == "mma" and o.results[0].name.startswith("dqt")]
        assert [m.results[0].type.shape for m in mmas] == [(64, 32)] * 2
        red = next(o for o in ops if o.kind == "tma_reduce_add")
        assert red.attr("transposed") and red.attr("coords")[1] == ("0+64" if c else "0")
        assert p.buffer(red.attr("buffer")).type.shape == (32, 64)
    assert [p.buffer(f"dss_c{c}_smem").count for c in (0, 1)] == [2, 2]
    assert not any(c.value.startswith("dss") for c in p.channels)
    assert p.smem_bytes <= 131568 + 1600


@pytest.mark.parametrize("make", ["_split", "_rows"])
def test_the_meeting_removed_is_caught(make):
    """Without the meeting a chain may read the other's dS slot before its owner stored this step's fill (an
    ``unfilled-read`` under some policy); the verifier refuses the view without a meeting before it. Either split."""
    bad = _map(pipeline.run(globals()[make](), dump_dir=""), lambda o: None if o.kind == "chain_sync" else o)
    kinds = set(violation_kinds(bad, seeds=2, shape=SHAPE))
    assert kinds - {"ok"} and kinds <= {"ok", "unfilled-read", "overwrite"}, kinds
    with pytest.raises(VerifyError, match="smem_view of %dss_c.* without a chain_sync"):
        check(bad)


@pytest.mark.parametrize("make", ["_split", "_rows"])
def test_the_slice_at_the_wrong_columns_is_caught(make):
    """Both chains' slices at the other's columns (K's head-dim columns, or with the split by rows dS^T's query
    columns): the reduces land on the wrong half of dQ."""
    bad = _map(pipeline.run(globals()[make](), dump_dir=""),
               lambda o: o.with_attrs(start=64 - o.attr("start")) if o.kind == "slice" else o)
    ok, report = interpret_report(globals()[make](), bad, seeds=1)
    assert not ok and "outputs differ from torch" in report, report


def test_a_ds_tile_rewritten_while_the_other_chain_reads_it_is_caught():
    """One copy of each dS tile: a chain stores step j+1's dS (after passing meeting j) while the other may still
    read step j's with its wgmma: an ``overwrite`` (or a read of the newer fill) under some policy."""
    p = pipeline.run(_split(), dump_dir="")
    bad = replace(p, buffers=tuple(replace(b, count=1) if b.name.startswith("dss") else b for b in p.buffers))
    kinds = set(violation_kinds(bad, seeds=2, shape=SHAPE))
    assert kinds - {"ok"} and kinds <= {"ok", "overwrite", "unfilled-read"}, kinds
    with pytest.raises(VerifyError, match="need 2 copies"):
        check(bad)


def test_dq_split_needs_two_chains_and_64_head_dim_columns_each():
    with pytest.raises(PassError, match="needs data_partition > 1"):
        pipeline.run(build(AttentionBwdRequest(128, "bf16", False, dq="reduce"),
                           replace(_opts(), data_partition=1, block_n=64)), dump_dir="")
    with pytest.raises(PassError, match="neither D/f = 64/2 nor BM/f = 32/2 is a multiple of 64"):
        pipeline.run(build(AttentionBwdRequest(64, "bf16", False, dq="reduce"), _opts()), dump_dir="")
    with pytest.raises(PassError, match="it is not added by a tma_reduce_add"):
        pipeline.run(build(AttentionBwdRequest(128, "bf16", False, dq="atomic"), _opts(bm=64)), dump_dir="")


def test_without_dq_split_the_chains_add_partials():
    """The option is what decides: off, each chain reduces its full-shape partial (the reduce form as before)."""
    p = pipeline.run(build(AttentionBwdRequest(128, "bf16", False, dq="reduce"), _opts(split=False, bm=64)),
                     dump_dir="")
    assert not any(o.kind in ("chain_sync", "smem_view", "slice") for pt in p.partitions for o in walk(pt.body))


def _rows(causal=False, dt="bf16"):
    return build(AttentionBwdRequest(64, dt, causal, dq="reduce"), _opts(bm=128, fold=True))


@pytest.mark.parametrize("causal", [False, True])
def test_rows_every_policy_and_seed_matches_torch(causal):
    """d=64, BM 128 (``bwd_128x128_dp2_dqsplit_fold``): the split by query rows, verified after every stage; every
    policy x 2 seeds against the math backward (ragged lengths, two Q blocks a head at most: Sq 100 < 128 x 2)."""
    before = _rows(causal)
    after = pipeline.run(before, verify=True, dump_dir="")
    ok, report = interpret_report(before, after, seeds=2)
    assert ok, report


def test_rows_the_chains_share_ds_and_split_dq_by_query_rows():
    """Each consumer: its dS^T store, one meeting, two dQ wgmmas over the 64 query columns c*64.. of its own tile and
    of a view of the other's (K whole, the other chain's load read as the wgmma's B), one reduce at row c*64 (not
    transposed) from a [64, 64] fp32 staging tile; dS tiles in two copies."""
    p = pipeline.run(_rows(), dump_dir="")
    for c in (0, 1):
        ops = [o for o in walk(p.partition(f"consumer{c}").body)]
        kinds = [o.kind for o in ops if o.kind in ("smem_store", "chain_sync", "smem_view", "tma_reduce_add")]
        assert kinds == ["smem_store", "chain_sync", "smem_view", "tma_reduce_add"]
        assert [o.attr("start") for o in ops if o.kind == "slice"] == [c * 64, c * 64]
        mmas = [o for o in ops if o.kind == "mma" and o.results[0].name.startswith("dq")]
        assert [m.results[0].type.shape for m in mmas] == [(64, 64)] * 2
        assert sorted(m.operands[1] for m in mmas) == ["k_c0", "k_c1"]
        red = next(o for o in ops if o.kind == "tma_reduce_add")
        assert not red.attr("transposed") and red.attr("coords")[1] == "0"
        assert red.attr("coords")[0].endswith("+64") == bool(c)
        assert p.buffer(red.attr("buffer")).type.shape == (64, 64)
    assert [p.buffer(f"dss_c{c}_smem").count for c in (0, 1)] == [2, 2]
    assert p.smem_bytes <= 232448


def test_a_chain_reading_another_chains_load_needs_dq_split():
    """The verifier lets a chain's wgmma read another chain's TMA load only under dq_split (the split dQ's K)."""
    p = pipeline.run(_rows(), dump_dir="")
    with pytest.raises(VerifyError, match="chain 0 reads %k_c1 of chain 1"):
        check(replace(p, options=replace(p.options, dq_split=False)))
