"""Mutation tests: break a valid Program the way a buggy pass would, and the interpreter must say so.

Every mutation is made here, on the IR object or its text (never by editing a pass): a ring with fewer
slots than the async wgmma needs, a dropped release, a flipped phase, a cross-partition use without a
channel, wrong expect-tx bytes, a missing load, a missing wgmma wait, an extra release, and buffers
that share bytes while both are live. Each runs under every policy and several seeds; the unmutated
Program passes the same runs (test_interp_configs.py).
"""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from programs import violation_kinds

from torch_autows.interp import POLICIES, Violation, make_instance, run_partitioned
from torch_autows.ir import format_program, op, parse_program, walk
from torch_autows.passes import code_partition, pipeline
from torch_autows.runtime.gemm import CONFIGS
from torch_autows.templates.gemm import GemmRequest, build

SEEDS = 4


def _stages(config="ws_p_128x128", **kw):
    trace: list = []
    pipeline.run(build(GemmRequest(1, 1, 1, **kw), CONFIGS[config]), trace=trace)
    return dict(trace)


def _kinds(program, seeds=SEEDS, policies=POLICIES, shape=None) -> list[str]:
    return violation_kinds(program, seeds, policies, shape)


# ------------------------------------------------------------------------------------------ helpers


def ring_count(planned, count):
    """memory_plan output with every ring given ``count`` slots, then code_partition as usual."""
    bufs = tuple(replace(b, count=count) if b.count > 1 else b for b in planned.buffers)
    return code_partition.run(replace(planned, buffers=bufs))


def edit_body(program, part, fn):
    """Apply ``fn(ops) -> ops`` to every op list (top level and loop bodies) of one partition."""
    def visit(ops):
        ops = tuple(replace(o, body=visit(o.body)) if o.body else o for o in ops)
        return tuple(fn(ops))
    return replace(program, partitions=tuple(replace(pt, body=visit(pt.body)) if pt.name == part else pt
                                             for pt in program.partitions))


def drop(program, part, kind):
    return edit_body(program, part, lambda ops: [o for o in ops if o.kind != kind])


def drop_text_line(program, part, line):
    """Remove ``line`` from one partition's code in the printed Program and parse it back."""
    text = format_program(program)
    head = f"  code {part} {{\n"
    start = text.index(head)
    end = text.index("\n  }\n", start)
    section = text[start:end]
    assert line in section, line
    return parse_program(text[:start] + section.replace(line + "\n", "", 1) + text[end:])


def flip_phase(program, part):
    """Shift one partition's ring counter by a whole lap: same slots, opposite phase."""
    g = program.groups[0]
    laps = tuple(op("advance", group=g.name) for _ in range(g.count))
    return replace(program, partitions=tuple(replace(pt, body=laps + pt.body) if pt.name == part else pt
                                             for pt in program.partitions))


def set_lag(program, lag):
    """Every release (and release_tail) with ``lag``: what code_partition would emit for that lag."""
    def fn(ops):
        return [o.with_attrs(lag=lag) if o.kind in ("release", "release_tail") else o for o in ops]
    return replace(program, partitions=tuple(edit_body(program, pt.name, fn).partition(pt.name)
                                             for pt in program.partitions))


# ------------------------------------------------------------------------------------------ tests


def test_ring_shallower_than_the_wgmma_in_flight():
    stages = _stages()
    kinds = _kinds(ring_count(stages["memory_plan"], 1))  # pending=1 needs 2 slots
    assert set(kinds) <= {"deadlock", "overwrite"} and "ok" not in kinds, kinds


def test_release_before_the_wgmma_retires():
    stages = _stages()
    kinds = _kinds(set_lag(ring_count(stages["memory_plan"], 2), 0))
    assert set(kinds) <= {"release-before-retire", "overwrite"} and "ok" not in kinds, kinds


def test_dropped_release_deadlocks():
    after = _stages()["code_partition"]
    mutated = drop_text_line(after, "consumer0", "      release() {group='g0', lag=1}")
    assert sum(o.kind == "release" for o in walk(mutated.partition("consumer0").body)) == 0
    kinds = _kinds(mutated)
    assert set(kinds) <= {"deadlock", "unbalanced"} and "ok" not in kinds, kinds
    assert "deadlock" in kinds


def test_dropped_release_tail_unbalanced_at_exit():
    after = _stages()["code_partition"]
    # one tile: no later acquire waits for the last slot, so only the exit check can see it
    assert set(_kinds(drop(after, "consumer0", "release_tail"), shape=(100, 64, 300))) == {"unbalanced"}
    # one tile per CTA, epilogue staging reusing the ring's bytes: the store clobbers the unreleased slot
    after = _stages("ws_np_128x256")["code_partition"]
    assert set(_kinds(drop(after, "consumer0", "release_tail"))) == {"overwrite"}


def test_flipped_phase_in_a_consumer():
    after = _stages()["code_partition"]
    kinds = _kinds(flip_phase(after, "consumer0"))
    assert set(kinds) <= {"wrong-phase", "deadlock", "unfilled-read"} and "ok" not in kinds, kinds
    assert "wrong-phase" in kinds  # the parity alone let a wait pass on another lap's phase


def test_flipped_phase_in_the_producer():
    after = _stages()["code_partition"]
    kinds = _kinds(flip_phase(after, "producer"))
    assert set(kinds) <= {"wrong-phase", "deadlock"} and "ok" not in kinds, kinds


def test_cross_partition_use_without_channel():
    planned = _stages()["memory_plan"]
    chans = tuple(replace(c, dsts=("consumer0",)) if c.value == "b" else c for c in planned.channels)
    mutated = code_partition.run(replace(planned, channels=chans))
    kinds = _kinds(mutated)
    assert set(kinds) == {"no-channel"}, kinds
    with pytest.raises(Violation, match=r"consumer1 reads %b: it is defined in producer.*no channel"):
        run_partitioned(mutated, make_instance(mutated, 0).inputs())


def test_missing_get_is_named():
    after = _stages()["code_partition"]
    mutated = drop_text_line(after, "consumer1", "      %b:bf16[64,128]@smem = get() {buffer='b_smem', group='g0'}")
    with pytest.raises(Violation, match="lists consumer1, but this body has no `get`"):
        run_partitioned(mutated, make_instance(mutated, 0).inputs())


def test_expect_bytes_too_small():
    after = _stages()["code_partition"]
    g = after.groups[0]
    mutated = replace(after, groups=(replace(g, nbytes=g.nbytes - 64 * 128 * 2),))  # forgets the B tile
    kinds = _kinds(mutated)
    assert set(kinds) <= {"unfilled-read", "over-arrive"} and "ok" not in kinds, kinds


def test_read_of_a_slot_never_filled():
    after = _stages()["code_partition"]
    g = after.groups[0]
    mutated = edit_body(after, "producer", lambda ops: [o for o in ops if o.attr("buffer") != "b_smem"])
    mutated = replace(mutated, groups=(replace(g, nbytes=g.nbytes - 64 * 128 * 2),))
    assert set(_kinds(mutated)) == {"unfilled-read"}
    with pytest.raises(Violation, match=r"reads b_smem\[0\] expecting fill n=0, but it was never filled"):
        run_partitioned(mutated, make_instance(mutated, 0).inputs())


def test_accumulator_used_before_wgmma_wait():
    after = _stages()["code_partition"]
    part = after.partition("consumer0")
    done = next(o for o in walk(part.body) if o.kind == "mma_wait")
    ren = {done.results[0].name: done.operands[0]}
    mutated = edit_body(after, "consumer0", lambda ops: [
        replace(o, operands=tuple(ren.get(x, x) for x in o.operands)) for o in ops if o.kind != "mma_wait"])
    assert set(_kinds(mutated)) == {"release-before-retire"}  # release_tail frees a slot the wgmma reads
    assert set(_kinds(drop(mutated, "consumer0", "release_tail"))) == {"async-use"}


def test_extra_release_over_arrives():
    after = _stages()["code_partition"]
    mutated = edit_body(after, "consumer1", lambda ops: [o.with_attrs(lag=2) if o.kind == "release_tail" else o
                                                         for o in ops])
    kinds = _kinds(mutated)
    assert set(kinds) <= {"over-arrive", "bad-release"} and "ok" not in kinds, kinds


def test_live_buffers_sharing_bytes():
    planned = _stages()["memory_plan"]  # persistent: the producer fills the next tile's ring during the epilogue
    ring = planned.buffer("a_c1_smem")
    bufs = tuple(replace(b, offset=ring.offset) if b.name == "out_c0_stage" else b for b in planned.buffers)
    kinds = _kinds(code_partition.run(replace(planned, buffers=bufs)))
    assert set(kinds) == {"overwrite"}, kinds


def test_staging_copies_overlapping_another_chain():
    planned = _stages("ws_p_128x128_e2")["memory_plan"]
    c0 = planned.buffer("out_c0_stage")
    assert c0.count == 2
    # out_c1_stage starts at c0's second copy: the copies of the two chains share bytes while both are live
    bufs = tuple(replace(b, offset=c0.offset + c0.type.nbytes) if b.name == "out_c1_stage" else b
                 for b in planned.buffers)
    kinds = _kinds(code_partition.run(replace(planned, buffers=bufs)))
    # the race needs a second tile per CTA while the first store drains: most schedules hit it
    assert kinds.count("overwrite") > len(kinds) // 2 and set(kinds) <= {"overwrite", "ok"}, kinds


def test_violation_trace_is_readable():
    after = _stages()["code_partition"]
    mutated = drop_text_line(after, "consumer0", "      release() {group='g0', lag=1}")
    with pytest.raises(Violation) as info:
        run_partitioned(mutated, make_instance(mutated, 0).inputs(), policy="random", seed=1)
    text = str(info.value)
    print(text)
    for part in ("violation [deadlock]", "every live partition is blocked", "producer blocked at `acquire()",
                 "g0.empty[", "step=", "partition=", "group=g0", "slot=", "phase=lap", "policy=random(seed=1)",
                 "op: wait_ready() {group='g0'}", "last 40 events:", "cta0 consumer0: wait_ready()"):
        assert part in text, part
    v = info.value
    assert (v.kind, v.group) == ("deadlock", "g0") and len(v.events) == 40


def test_overwrite_is_wrong_data_and_detected():
    """Recording mode: the run goes on past the violations, and the early refill reaches the output."""
    mutated = set_lag(ring_count(_stages()["memory_plan"], 2), 0)
    wrong = 0
    for seed in range(SEEDS):
        inst = make_instance(mutated, seed)
        found: list = []
        out = run_partitioned(mutated, inst.inputs(), policy="adversarial", seed=seed, violations=found)
        kinds = {v.kind for v in found}
        assert {"release-before-retire", "overwrite"} <= kinds, kinds
        overwrite = next(v for v in found if v.kind == "overwrite")
        assert "has not retired its read" in overwrite.message and overwrite.partition == "producer"
        wrong += not torch.equal(out["c"], inst.reference["c"])
    assert wrong == SEEDS


def test_dropped_in_loop_wait_ready_is_a_stale_slot():
    """reliability-2 D7: an earlier wait of the same group must not cover a dropped one after advance()."""
    from torch_autows.runtime.attention import CONFIGS as ATTENTION_CONFIGS
    from torch_autows.templates.attention import AttentionRequest
    from torch_autows.templates.attention import build as build_attention

    after = pipeline.run(build_attention(AttentionRequest(64, "bf16", False), ATTENTION_CONFIGS["ws_p_128x128"]))
    # the K/V ring, in the KV loop inside the tile_loop
    mutated = drop_text_line(after, "consumer0", "        wait_ready() {group='g0'}")
    (tiles,) = mutated.partition("consumer0").body
    body = tiles.body
    loop = next(o for o in body if o.kind == "loop")
    assert not any(o.kind == "wait_ready" for o in loop.body)
    assert any(o.kind == "wait_ready" and o.attr("group") == "g0" for o in body)  # the prologue's stays
    block_n = next(o.results[0].type.shape[0] for o in walk(after.partition("producer").body)
                   if o.kind == "load" and o.attr("buffer") == "k_smem")
    caught = 0
    for policy in POLICIES:
        for seed in range(8):
            inst = make_instance(mutated, seed)
            steps = -(-inst.scalars["Skv"] // block_n)
            if steps < 2:  # no loop iteration: the mutated code never runs
                out = run_partitioned(mutated, inst.inputs(), policy=policy, seed=seed)
                assert inst.matches(out), (inst.desc, inst.error(out))
                continue
            with pytest.raises(Violation) as info:
                run_partitioned(mutated, inst.inputs(), policy=policy, seed=seed)
            v, text = info.value, str(info.value)
            assert (v.kind, v.partition, v.group) == ("stale-slot", "consumer0", "g0"), (inst.desc, text)
            assert v.op.kind == "get" and v.op.attr("buffer") == "k_smem", text
            for part in ("violation [stale-slot]: consumer0 uses the slot of group g0 at fill n=",
                         "without an acquire/wait_ready", "advance() at #", "op: %k:bf16[128,64]@smem = get()",
                         "last 40 events:", f"cta{v.cta} consumer0: %k:bf16[128,64]@smem = get()"):
                assert part in text, (part, text)
            assert len(v.events) == 40
            caught += 1
    assert caught >= len(POLICIES)  # some seeds do run >= 2 K/V steps
    with pytest.raises(Violation, match=r"violation \[stale-slot\]"):  # and a fixed long one, whatever the seeds
        run_partitioned(mutated, make_instance(mutated, 0, shape=(1, 1, 1, 64, 300)).inputs())
