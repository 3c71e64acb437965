"""``chain_sync``: the per-step meeting of the consumer chains on one mbarrier (arrive, then wait for the phase of the
partition's meetings so far), the first IR piece of the attention backward's split dQ at d=128 (passes/BACKWARD.md §4
step 8 (b); data_partition's ``dq_split`` makes it, test_attention_bwd_dq_split.py). These tests put it by hand after
each consumer's dS store in the reduce form's two-chain program without the split (chains adding partials): the
numbers stay right under every policy, and a chain that does not meet (or meets twice, or a count that is not the
chains') is a deadlock in the interpreter and refused by the verifier; codegen allocates the barrier with the chains'
count and waits on the parity of a per-partition counter."""
from __future__ import annotations

from dataclasses import replace

import pytest
from programs import violation_kinds

from torch_autows.codegen import gluon
from torch_autows.interp import interpret_report
from torch_autows.ir import Options, op, walk
from torch_autows.passes import pipeline
from torch_autows.templates.attention_bwd import AttentionBwdRequest, build
from torch_autows.verify import VerifyError, check

SHAPE = (1, 2, 1, 130, 100)  # batch, q heads, kv heads, Sq, Skv: two heads a CTA, ragged tails


def _before(dt="f32"):
    return build(AttentionBwdRequest(64, dt, False, dq="reduce"), Options(block_m=64, block_n=128, stages=2,
                                                                          data_partition=2))


def _met(p, parts=("consumer0", "consumer1"), count=2, twice=(), bar="ds_meet"):
    """``p`` with a ``chain_sync {bar, count}`` after each smem_store of the partitions ``parts`` (two in a row in
    those of ``twice``)."""
    def rw(ops, name):
        out = []
        for o in ops:
            if o.body:
                o = replace(o, body=rw(o.body, name))
            out.append(o)
            if o.kind == "smem_store" and name in parts:
                sync = replace(op("chain_sync", bar=bar, count=count), chain=o.chain, partition=name, stage=o.stage)
                out += [sync] * (2 if name in twice else 1)
        return tuple(out)

    return replace(p, partitions=tuple(replace(pt, body=rw(pt.body, pt.name)) for pt in p.partitions))


def _syncs(p):
    return [(pt.name, o.attr("bar"), o.attr("count")) for pt in p.partitions for o in walk(pt.body)
            if o.kind == "chain_sync"]


def test_meeting_chains_keep_the_numbers_under_every_policy():
    """Both consumers meet once a step after their dS store: verified, and every policy x 2 seeds matches torch."""
    before = _before()
    met = _met(pipeline.run(before, dump_dir=""))
    assert _syncs(met) == [("consumer0", "ds_meet", 2), ("consumer1", "ds_meet", 2)]
    check(met)
    ok, report = interpret_report(before, met, seeds=2)
    assert ok, report


def test_a_chain_that_does_not_meet_is_a_deadlock_and_refused():
    """Only consumer0 meets: its first wait never passes (a phase needs both arrivals)."""
    bad = _met(pipeline.run(_before(), dump_dir=""), parts=("consumer0",))
    assert set(violation_kinds(bad, seeds=1, shape=SHAPE)) == {"deadlock"}
    with pytest.raises(VerifyError, match="ds_meet expects 2 meeting chains a phase"):
        check(bad)


def test_a_chain_meeting_twice_a_step_is_a_deadlock_and_refused():
    """consumer1 meets twice a step: it runs ahead of consumer0 by a phase a step and is left waiting for a phase
    consumer0 never arrives in."""
    bad = _met(pipeline.run(_before(), dump_dir=""), twice=("consumer1",))
    assert set(violation_kinds(bad, seeds=1, shape=SHAPE)) == {"deadlock"}
    with pytest.raises(VerifyError, match="meet a different number of times"):
        check(bad)


def test_a_count_that_is_not_the_chains_is_a_deadlock_and_refused():
    bad = _met(pipeline.run(_before(), dump_dir=""), count=3)
    assert set(violation_kinds(bad, seeds=1, shape=SHAPE)) == {"deadlock"}
    with pytest.raises(VerifyError, match="ds_meet expects 3 meeting chains"):
        check(bad)


def test_a_template_cannot_meet():
    p = _before()
    p = replace(p, body=(*p.body, op("chain_sync", bar="m", count=2)))
    with pytest.raises(VerifyError, match="chain_sync in a template"):
        check(p, "template")


def test_before_code_partition_the_chains_meet_by_their_chain():
    """Between data_partition and code_partition the meetings are counted per chain (the ops' ``chain``)."""
    trace: list = []
    pipeline.run(_before(), dump_dir="", trace=trace)
    p = dict(trace)["data_partition"]
    loop = next(o for o in p.body if o.kind == "loop")

    def with_syncs(chains):
        body = tuple(o for o in loop.body if o.kind != "yield") + tuple(
            replace(op("chain_sync", bar="m", count=2), chain=c) for c in chains) + (loop.body[-1],)
        return replace(p, body=tuple(replace(o, body=body) if o is loop else o for o in p.body))

    check(with_syncs((0, 1)), "data_partition")
    with pytest.raises(VerifyError, match="m expects 2 meeting chains"):
        check(with_syncs((0,)), "data_partition")
    with pytest.raises(VerifyError, match="only chains 0..1 meet there"):
        check(with_syncs((0, 1, 2)), "data_partition")


def test_codegen_allocates_the_meeting_and_waits_on_the_partitions_parity():
    src = gluon.generate(_met(pipeline.run(_before("bf16"), dump_dir="")))
    assert src.count("ds_meet = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())") == 1
    assert src.count("mbarrier.init(ds_meet.index(0), count=2)") == 1
    for c in (0, 1):
        part = src[src.index(f"def consumer{c}("):]
        part = part[:part.index("\n@gluon.jit")] if "\n@gluon.jit" in part else part
        assert "ds_meet_n = 0" in part
        store = part.index(f"v_dss_c{c}.store(")
        sync = part.index("mbarrier.arrive(ds_meet.index(0))")
        assert store < sync < part.index("mbarrier.wait(ds_meet.index(0), ds_meet_n & 1)") < part.index(
            "ds_meet_n += 1")
    assert "def producer(" in src and "ds_meet_n" not in src[src.index("def producer("):][:2000]


def _two_copies(p):
    """``p`` with two copies of each dS tile (``smem_store``'s buffers), placed past every other buffer."""
    top = p.smem_bytes
    bufs = []
    for b in p.buffers:
        if b.name.startswith("dss"):
            b = replace(b, count=2, offset=top)
            top += -(-b.nbytes // 1024) * 1024
        bufs.append(b)
    return replace(p, buffers=tuple(bufs), smem_bytes=top)


def test_smem_store_into_two_copies_alternates_slots():
    """Two copies of dS: the interpreter stores step n into slot n % 2 and every policy keeps the numbers; the
    emitter indexes the tile with a per-partition counter (it refused more than one copy before)."""
    before = _before("bf16")
    p = _two_copies(pipeline.run(before, dump_dir=""))
    check(p)
    ok, report = interpret_report(before, p, seeds=1)
    assert ok, report
    src = gluon.generate(p)
    for c in (0, 1):
        assert f"dss_c{c}_smem = gl.allocate_shared_memory(gl.bfloat16, [2, " in src
        part = src[src.index(f"def consumer{c}("):]
        assert f"dss_c{c}_smem_n = 0" in part
        i = part.index(f"v_dss_c{c} = dss_c{c}_smem.index(dss_c{c}_smem_n % 2)")
        assert part.index(f"v_dss_c{c}.store(", i) < part.index(f"dss_c{c}_smem_n += 1", i)
