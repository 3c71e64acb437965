"""The attention backward's main kernel through the passes (passes/BACKWARD.md §3, step 3): verified after every
stage, interpreted under every policy against torch, dQ's partial-sum rule in data_partition, the verifier's
accumulate check, and a plain dQ store caught as a ``global-race``. The separate form (step 8: the main kernel with
``dq="none"`` and the dQ kernel, templates/attention_bwd_dq.py) through the same passes and checks."""
from __future__ import annotations

from dataclasses import replace

import pytest
from programs import violation_kinds

from torch_autows.interp import POLICIES, interpret_report
from torch_autows.ir import Options, TileType, Value, op, walk
from torch_autows.passes import PassError, data_partition, pipeline
from torch_autows.templates.attention_bwd import AttentionBwdRequest, build
from torch_autows.templates.attention_bwd_dq import AttentionBwdDqRequest
from torch_autows.templates.attention_bwd_dq import build as build_dq
from torch_autows.verify import VerifyError, check


def _opts(dp=1, bn=64):
    return Options(block_m=64, block_n=bn, stages=2, data_partition=dp)


@pytest.mark.parametrize("d,dt,causal", [(64, "bf16", True), (128, "fp16", False), (64, "f32", False)])
def test_pipeline_verifies_after_every_stage(d, dt, causal):
    trace: list = []
    pipeline.run(build(AttentionBwdRequest(d, dt, causal), _opts()), verify=True, dump_dir="", trace=trace)
    assert [n for n, _ in trace] == list(pipeline.STAGES)
    last = trace[-1][1]
    assert [b.name for b in last.buffers if b.value == "dss"] == ["dss_smem"]  # dS's own SMEM tile, one copy
    assert last.buffer("dss_smem").count == 1


@pytest.mark.parametrize("d,dt,causal,dp", [(64, "f32", True, 1), (128, "f32", False, 1), (64, "bf16", True, 1),
                                             (64, "f32", False, 2)])
def test_every_policy_and_seed_matches_torch(d, dt, causal, dp):
    before = build(AttentionBwdRequest(d, dt, causal), _opts(dp, 64 * dp))
    after = pipeline.run(before, verify=True, dump_dir="")
    ok, report = interpret_report(before, after, seeds=4)
    assert ok, report


def test_a_plain_dq_store_after_the_passes_is_a_global_race():
    after = pipeline.run(build(AttentionBwdRequest(64, "f32", False), _opts()), dump_dir="")

    def plain(ops):
        return tuple(replace(o, kind="store_ptr", body=plain(o.body)) if o.kind == "atomic_add_ptr"
                     else replace(o, body=plain(o.body)) for o in ops)
    mutated = replace(after, partitions=tuple(replace(pt, body=plain(pt.body)) for pt in after.partitions))
    assert any(o.kind == "store_ptr" and o.attr("arg") == "dq_acc" for pt in mutated.partitions for o in walk(pt.body))
    # shapes with several KV blocks per Q block: their dQ stores land on the same rows
    kinds = violation_kinds(mutated, seeds=2, shape=(1, 2, 1, 70, 200))
    assert kinds == ["global-race"] * (2 * len(POLICIES)), kinds
    assert set(violation_kinds(after, seeds=2, shape=(1, 2, 1, 70, 200))) == {"ok"}


def test_two_chains_add_full_size_partials_of_dq():
    """data_partition=2 splits the keys: each chain's dS K is a partial sum over its half of the keys, added at
    the same dQ rows (no row shift), while dK/dV rows shift by the chain's first key."""
    p = data_partition.run(build(AttentionBwdRequest(64, "bf16", True), _opts(2, 128)))
    adds = [o for o in walk(p.body) if o.kind == "atomic_add_ptr"]
    assert [o.chain for o in adds] == [0, 1] and adds[0].attr("row") == adds[1].attr("row")
    dq = {r.name: r.type.shape for o in walk(p.body) if o.kind == "mma" for r in o.results if r.name.startswith("dq")}
    assert dq == {"dq_c0": (64, 64), "dq_c1": (64, 64)}
    stores = [o for o in walk(p.body) if o.kind == "store_ptr" and o.attr("arg") == "dk"]
    assert stores[1].attr("row") == stores[0].attr("row") + "+64"


def test_a_partial_sum_read_by_anything_but_an_add_is_refused():
    p = build(AttentionBwdRequest(64, "bf16", False), _opts())
    loop = next(o for o in p.body if o.kind == "loop")
    extra = op("mulc", [Value("dq2", next(r.type for o in loop.body for r in o.results if r.name == "dq"))], ["dq"],
               c="scale")
    body = loop.body[:-1] + (extra, loop.body[-1])
    bad = replace(p, body=tuple(replace(o, body=body) if o is loop else o for o in p.body))
    with pytest.raises(PassError, match="a partial sum would be stored"):
        data_partition.run(bad)


def _retarget(p, **change):
    def fix(ops):
        return tuple(replace(o.with_attrs(**change) if o.kind in ("load", "load_vec") and o.attr("arg") == "delta"
                             else o, body=fix(o.body)) for o in ops)
    return replace(p, body=fix(p.body))


def test_verifier_checks_what_smem_read_reads():
    """The producer's lse2/delta rows reach the math through ``smem_read`` (SMEM -> registers, same shape and dtype);
    reading a register tile, or changing the shape on the way, is refused at the template."""
    p = build(AttentionBwdRequest(64, "bf16", False, dq="none"), _opts())
    check(p, "template")
    loop = next(o for o in p.body if o.kind == "loop")

    def swap(o):
        return replace(p, body=tuple(replace(x, body=tuple(o(y) for y in x.body)) if x is loop else x for x in p.body))

    reg = swap(lambda o: replace(o, operands=("lr",)) if o.kind == "smem_read" and o.results[0].name == "dr" else o)
    with pytest.raises(VerifyError, match="reads an SMEM tile into registers"):
        check(reg, "template")
    wide = swap(lambda o: replace(o, results=(Value("dr", TileType("f32", (2, 64))),))
                if o.kind == "smem_read" and o.results[0].name == "dr" else o)
    with pytest.raises(VerifyError, match="the same shape and dtype"):
        check(wide, "template")


def test_verifier_checks_what_atomic_adds_accumulate_into():
    p = build(AttentionBwdRequest(64, "bf16", False), _opts())
    check(p, "template")
    with pytest.raises(VerifyError, match="only adds may touch it"):
        check(_retarget(p, arg="dq_acc"), "template")  # a read of the workspace the CTAs are adding to
    loop = next(o for o in p.body if o.kind == "loop")
    body = tuple(o.with_attrs(arg="dk") if o.kind == "atomic_add_ptr" else o for o in loop.body)
    with pytest.raises(VerifyError, match="must be an f32 ptr out arg"):
        check(replace(p, body=tuple(replace(o, body=body) if o is loop else o for o in p.body)), "template")


@pytest.mark.parametrize("kernel", ["atomic", "reduce", "none", "dq"])
def test_every_stage_prints_and_parses_back(kernel):
    from torch_autows.ir import format_program, parse_program

    trace: list = []
    program = (build_dq(AttentionBwdDqRequest(64, "bf16", True), Options(block_m=128, block_n=64, data_partition=2))
               if kernel == "dq" else build(AttentionBwdRequest(64, "bf16", True, dq=kernel), _opts(2, 128)))
    pipeline.run(program, dump_dir="", trace=trace)
    for name, p in trace:
        assert parse_program(format_program(p)) == p, name


def _consumer_loop(p, part="consumer0"):
    return next(o for o in walk(p.partition(part).body) if o.kind == "loop")


def _with_loop_body(p, part, body):
    def fix(ops):
        return tuple(replace(o, body=body) if o.kind == "loop" else replace(o, body=fix(o.body)) for o in ops)
    return replace(p, partitions=tuple(replace(pt, body=fix(pt.body)) if pt.name == part else pt
                                       for pt in p.partitions))


def test_mmas_of_a_step_overlap_as_fa3_issues_them():
    """Break 2 (BACKWARD.md §3, step 6): S^T and dP^T issued back to back, one retired before the softmax
    (pending 1), the other before dS; dV in flight beside dS's SMEM store; dK issued after dQ and in flight under
    dQ's adds; everything retired at the step's end, where the Q/dO slot is released with lag 0 (no tail)."""
    p = pipeline.run(build(AttentionBwdRequest(128, "bf16", True), _opts(2, 128)), verify=True, dump_dir="")
    loop = _consumer_loop(p)
    seq = [(o.kind, o.results[0].name if o.results else o.attr("group"), o.attr("pending"))
           for o in loop.body if o.kind in ("mma", "mma_wait", "smem_store", "atomic_add_ptr", "release")]
    assert seq == [("mma", "st_c0", 0), ("mma", "dpt_c0", 0), ("mma_wait", "st_c0_w", 1), ("mma", "dv_new_c0", 0),
                   ("mma_wait", "dpt_c0_w", 1), ("smem_store", "dss_c0", None), ("mma", "dq_c0", 0),
                   ("mma", "dk_new_c0", 0), ("mma_wait", "dv_new_c0_w", 2), ("mma_wait", "dq_c0_w", 1),
                   ("atomic_add_ptr", None, None),
                   ("mma_wait", "dk_new_c0_w", 0), ("release", "g0", None)]
    assert all(o.attr("wait") is False for o in loop.body if o.kind == "mma")
    assert [o.attr("lag") for o in loop.body if o.kind == "release"] == [0]
    after = p.partition("consumer0").body
    assert not any(o.kind == "release_tail" for o in walk(after))
    # a register A operand stays alive up to its mma's wait
    assert next(o for o in loop.body if o.kind == "mma_wait" and o.operands[0] == "dk_new_c0").operands[1:] == \
        ("ds16_c0",)


def test_a_reader_moved_before_its_wait_is_caught():
    """The interpreter catches a step that reads an mma's registers before the wait that retires it (``async-use``),
    and a release moved above the wait that retires the slot's last reader (``release-before-retire``: the producer
    could refill the slot under the wgmma)."""
    p = pipeline.run(build(AttentionBwdRequest(64, "f32", False), _opts()), dump_dir="")
    assert set(violation_kinds(p, seeds=2)) == {"ok"}
    body = list(_consumer_loop(p).body)
    w = next(i for i, o in enumerate(body) if o.kind == "mma_wait" and o.operands[0] == "st")
    r = next(i for i, o in enumerate(body) if "st_w" in o.operands)
    early = replace(body[r], operands=tuple("st" if x == "st_w" else x for x in body[r].operands))
    moved = body[:w] + [early] + body[w:r] + body[r + 1:]
    assert set(violation_kinds(_with_loop_body(p, "consumer0", tuple(moved)), seeds=2)) == {"async-use"}
    rel = next(i for i, o in enumerate(body) if o.kind == "release")
    last = next(i for i, o in enumerate(body) if o.kind == "mma_wait" and o.operands[0] == "dk_new")
    assert last < rel
    moved = body[:last] + body[rel:rel + 2] + body[last:rel] + body[rel + 2:]
    assert set(violation_kinds(_with_loop_body(p, "consumer0", tuple(moved)), seeds=2)) == {"release-before-retire"}


@pytest.mark.parametrize("kernel,d,dt,causal,dp,bm,persistent", [
    ("main", 64, "f32", True, 1, 64, False), ("main", 64, "f32", False, 2, 64, False),
    ("main", 128, "bf16", True, 2, 32, False), ("main", 128, "bf16", False, 2, 64, False),
    ("main", 64, "bf16", False, 2, 64, True), ("dq", 64, "f32", True, 1, 64, False),
    ("dq", 64, "f32", False, 2, 128, False), ("dq", 128, "bf16", True, 2, 128, False),
    ("dq", 64, "bf16", False, 2, 128, True), ("dq", 128, "bf16", True, 2, 128, True)])
def test_separate_form_every_policy_and_seed_matches_torch(kernel, d, dt, causal, dp, bm, persistent):
    """Both kernels of the separate form, verified after every stage and interpreted under every policy and seed
    (ragged lengths, GQA, causal Sq <, =, > Skv at random) against the fp32 math backward. The dQ kernel splits its
    Q rows over the chains (as the forward), the main kernel its keys; neither has a partial sum. ``bm``: queries a
    step; ``persistent``: 2 CTAs walk every tile (the picks ``bwd_64x128_dp2_p``, ``dq_128x128_dp2_p``)."""
    if kernel == "dq":
        before = build_dq(AttentionBwdDqRequest(d, dt, causal),
                          Options(block_m=bm, block_n=64, stages=2, data_partition=dp, persistent=persistent))
    else:
        before = build(AttentionBwdRequest(d, dt, causal, dq="none"),
                       Options(block_m=bm, block_n=64 * dp, stages=2, data_partition=dp, persistent=persistent))
    after = pipeline.run(before, verify=True, dump_dir="")
    kinds = [o.kind for pt in after.partitions for o in walk(pt.body)]
    assert kinds.count("mma") == (3 if kernel == "dq" else 4) * dp and "store_ptr" in kinds
    assert "atomic_add_ptr" not in kinds and "smem_store" not in kinds
    ok, report = interpret_report(before, after, seeds=3)
    assert ok, report


def test_dq_kernel_chains_split_the_query_rows():
    p = data_partition.run(build_dq(AttentionBwdDqRequest(64, "bf16", True),
                                    Options(block_m=128, block_n=64, stages=2, data_partition=2)))
    stores = [o for o in walk(p.body) if o.kind == "store_ptr"]
    assert [o.chain for o in stores] == [0, 1] and stores[1].attr("row") == stores[0].attr("row") + "+64"
    assert {r.name: r.type.shape for o in walk(p.body) if o.kind == "mma" for r in o.results} == {
        f"{n}_c{c}": (64, 64) for n in ("s", "dp", "dq_new") for c in (0, 1)}


def test_dq_kernel_store_of_another_q_block_is_a_global_race():
    """One CTA per (head, Q block) stores each dQ element once: a store row that forgets the Q block makes the CTAs of
    one head store the same rows, which the interpreter reports (so does the deterministic-form claim fail)."""
    opts = Options(block_m=64, block_n=64, stages=2, data_partition=1)
    after = pipeline.run(build_dq(AttentionBwdDqRequest(64, "f32", False), opts), dump_dir="")
    assert set(violation_kinds(after, seeds=1, shape=(1, 2, 1, 150, 70))) == {"ok"}

    def drop_block(ops):
        return tuple(o.with_attrs(row="(pid_bh//Hq)*dq_rb+(pid_bh%Hq)*dq_rh") if o.kind == "store_ptr"
                     else replace(o, body=drop_block(o.body)) for o in ops)
    mutated = replace(after, partitions=tuple(replace(pt, body=drop_block(pt.body)) for pt in after.partitions))
    assert set(violation_kinds(mutated, seeds=1, shape=(1, 2, 1, 150, 70))) == {"global-race"}


def test_causal_grid_walks_group_m_heads_block_by_block():
    """``group_m`` groups the causal walk: that many heads' KV block 0, then their block 1, ... (Grid.group over
    (pid_bh, pid_n)); without the mask, and in every runtime config (group_m=1), the walk is head by head."""
    from torch_autows.runtime.attention_bwd import CONFIGS

    base = CONFIGS["bwd_64x128_dp2"]
    assert build(AttentionBwdRequest(64, "bf16", True, dq="none"), replace(base, group_m=8)).grid.group == 8
    assert build(AttentionBwdRequest(64, "bf16", False, dq="none"), replace(base, group_m=8)).grid.group == 1
    for name, opts in CONFIGS.items():
        assert build(AttentionBwdRequest(64, "bf16", True, dq="none"), opts).grid.group == 1, name
