"""The attention backward's "reduce" dQ form (passes/BACKWARD.md step 8: FA3's dQ accumulation) through the passes:
each chain's dQ partial goes registers -> its own fp32 SMEM staging tile -> one TMA bulk reduce-add (``tma_reduce_add``)
into a workspace padded to whole Q blocks per head. Verified after every stage, interpreted under every policy against
torch, and the mutations the checkers must catch: a staging tile overwritten before its reduce read it (its bytes
shared with dS's tile, or one tile for both chains), a dropped reduce, a reduce into the wrong kind of argument."""
from __future__ import annotations

from dataclasses import replace

import pytest
from programs import violation_kinds

from torch_autows.interp import POLICIES, interpret_report, make_instance, run_partitioned
from torch_autows.ir import Options, walk
from torch_autows.passes import pipeline
from torch_autows.templates.attention_bwd import AttentionBwdRequest, build, padded_rows
from torch_autows.verify import VerifyError, check


def _opts(dp=1, bn=64, persistent=False, fold=False):
    return Options(block_m=64, block_n=bn, stages=2, data_partition=dp, persistent=persistent, fold_rows=fold)


def _reduce(d=64, dt="f32", causal=False, dp=2, persistent=False, fold=False):
    return build(AttentionBwdRequest(d, dt, causal, dq="reduce"), _opts(dp, 64 * dp, persistent, fold))


@pytest.mark.parametrize("d,dt,causal,dp,persistent,fold", [
    (64, "f32", True, 1, False, False), (64, "f32", False, 2, False, False), (64, "bf16", True, 2, False, False),
    (128, "bf16", False, 2, False, False), (64, "bf16", False, 2, True, False), (64, "f32", True, 1, True, False),
    (64, "bf16", True, 2, True, True), (64, "f32", False, 2, False, True)])
def test_every_policy_and_seed_matches_torch(d, dt, causal, dp, persistent, fold):
    """Verified after every stage; every scheduling policy x 3 seeds (random shapes: ragged lengths, GQA, causal
    with Sq <, =, > Skv) gives the padded dQ workspace (zero past Sq), dK and dV of the fp32 math backward.
    ``persistent`` (``bwd_64x128_dp2_p``'s walk): 2 CTAs walk every (head, KV block) tile, the per-tile dK/dV and
    K/V ring slots reused from tile to tile. ``fold``: lse2/delta folded into the S^T/dP^T accumulators
    (``Options.fold_rows``; the sweep's ``_fold`` variants at d=64)."""
    before = _reduce(d, dt, causal, dp, persistent, fold)
    after = pipeline.run(before, verify=True, dump_dir="")
    ok, report = interpret_report(before, after, seeds=3)
    assert ok, report


def test_each_chain_stages_its_partial_in_its_own_tile():
    """Two chains of 64 keys: two reduces of full [BM, D] partials at the same coordinates (a partial is not shifted
    by the chain's rows), each through its own f32 staging tile of one copy that shares no bytes; dq_acc is a TMA
    tensor argument."""
    p = pipeline.run(_reduce(128, "bf16", True, 2), dump_dir="")
    assert p.arg("dq_acc").kind == "tensor" and p.arg("dq_acc").dtype == "f32"
    ops = [o for pt in p.partitions for o in walk(pt.body) if o.kind == "tma_reduce_add"]
    assert [(o.partition, o.attr("buffer")) for o in ops] == [("consumer0", "dq_c0_stage"),
                                                              ("consumer1", "dq_c1_stage")]
    assert ops[0].attr("coords") == ops[1].attr("coords")
    assert "cdiv(Sq,64)*64" in ops[0].attr("coords")[0]  # the head's padded rows
    stages = [p.buffer(f"dq_c{i}_stage") for i in (0, 1)]
    assert [(b.count, b.type.dtype, b.type.shape) for b in stages] == [(1, "f32", (64, 128))] * 2
    for s in stages:
        assert not any(b is not s and b.offset < s.offset + s.nbytes and s.offset < b.offset + b.nbytes
                       for b in p.buffers)
    assert p.smem_bytes <= p.arch.smem_limit


def _placed(p, name, offset):
    return replace(p, buffers=tuple(replace(b, offset=offset) if b.name == name else b for b in p.buffers))


def test_a_staging_tile_sharing_bytes_with_ds_is_overwritten_before_its_reduce_read_it():
    """memory_plan never lets a reduce's staging tile share bytes; placed over dS's tile, the next step's dS store
    overwrites it while the previous reduce (read until the next store_wait) still reads it: an ``overwrite``
    under every policy, and the verifier refuses the plan."""
    after = pipeline.run(_reduce(dp=1), dump_dir="")
    bad = _placed(after, "dq_stage", after.buffer("dss_smem").offset)
    assert set(violation_kinds(bad, seeds=1, shape=(1, 1, 1, 130, 60))) == {"overwrite"}
    assert set(violation_kinds(after, seeds=1, shape=(1, 1, 1, 130, 60))) == {"ok"}
    with pytest.raises(VerifyError, match="a reduce's staging tile shares no bytes"):
        check(bad, "memory_plan")


def test_two_chains_staging_in_one_tile_is_caught():
    """One staging tile for both chains' reduces: a chain's store_wait does not wait for the other's reduce, so its
    register store may overwrite the tile while that reduce reads it."""
    after = pipeline.run(_reduce(dp=2), dump_dir="")

    def one_tile(ops):
        return tuple(replace(o.with_attrs(buffer="dq_c0_stage") if o.kind == "tma_reduce_add" else o,
                             body=one_tile(o.body)) for o in ops)
    bad = replace(after, partitions=tuple(replace(pt, body=one_tile(pt.body)) for pt in after.partitions))
    kinds = violation_kinds(bad, seeds=2, shape=(1, 2, 1, 200, 100))
    assert "overwrite" in kinds and set(kinds) <= {"overwrite", "ok"}, kinds
    with pytest.raises(VerifyError, match="2 TMA reduce-adds stage in dq_c0_stage"):
        check(bad, "memory_plan")


def test_a_dropped_reduce_is_caught():
    before = _reduce(dp=1)
    after = pipeline.run(before, dump_dir="")

    def drop(ops):
        return tuple(replace(o, body=drop(o.body)) for o in ops if o.kind != "tma_reduce_add")
    bad = replace(after, partitions=tuple(replace(pt, body=drop(pt.body)) for pt in after.partitions))
    inst = make_instance(before, 0, shape=(1, 1, 1, 70, 70))
    assert inst.matches(run_partitioned(after, inst.inputs(), policy=POLICIES[0]))
    assert not inst.matches(run_partitioned(bad, inst.inputs(), policy=POLICIES[0]))


def test_workspace_rows_are_padded_per_head():
    """The reduce lands whole [BM, D] tiles in its head's padded rows: with Sq = 70 and BM = 64 each head owns 128
    rows, the rows 70..127 stay exactly zero (queries past Sq give P = 0) and the next head's rows are its own."""
    before = _reduce(dp=1)
    after = pipeline.run(before, dump_dir="")
    inst = make_instance(before, 1, shape=(1, 3, 1, 70, 90))
    out = run_partitioned(after, inst.inputs(), policy=POLICIES[0])
    ws = out["dq_acc"].view(3, padded_rows(70, 64), 64)
    assert ws.shape[1] == 128 and bool((ws[:, 70:] == 0).all()) and inst.matches(out)


def test_verifier_checks_what_reduces_accumulate_into():
    p = _reduce()
    check(p, "template")
    loop = next(o for o in p.body if o.kind == "loop")

    def with_reduce(**change):
        body = tuple(o.with_attrs(**change) if o.kind == "tma_reduce_add" else o for o in loop.body)
        return replace(p, body=tuple(replace(o, body=body) if o is loop else o for o in p.body))
    with pytest.raises(VerifyError, match="must be an f32 tensor out arg"):
        check(replace(p, args=tuple(replace(a, kind="ptr") if a.name == "dq_acc" else a for a in p.args)), "template")
    with pytest.raises(VerifyError, match="must be an f32 tensor out arg"):
        check(with_reduce(arg="q"), "template")
    with pytest.raises(VerifyError, match="one per dimension"):
        check(with_reduce(coords=("0",)), "template")
