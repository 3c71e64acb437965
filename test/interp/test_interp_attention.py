"""Attention Programs through both semantics: every runtime config (d 64/128, causal or not, bf16/fp16; d 96, 192 and
256 under the configs serving them) under every policy, against an fp32 softmax reference; plus the attention op
kinds and mutations.

Tile sizes are the runtime's (no shrinking). Each seed is a fresh shape: 1-2 batches, GQA groups 1-2,
ragged Sq and Skv (partial KV tiles are masked, partial query tiles are not stored).
"""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from programs import violation_kinds

from torch_autows.interp import POLICIES, InterpError, Violation, make_instance, run_partitioned, run_sequential
from torch_autows.ir import walk
from torch_autows.passes import pipeline
from torch_autows.runtime.attention import CONFIGS, choose_config, serves
from torch_autows.templates.attention import AttentionRequest, build

SEEDS = 10


def _pair(d=64, dtype="bf16", causal=False, config="ws_p_128x128"):
    before = build(AttentionRequest(d, dtype, causal), CONFIGS[config])
    return before, pipeline.run(before)


# head dims in tiles wider than D (96 in 128 columns, 192 in 256: templates.attention.tile_d) or in column pieces
# (split_d), and 256: for 96 the config the runtime picks (in pieces) and the padded d=128 pick, every config serving
# 192 and 256
_PADDED_96 = "ws_p_128x128_q2_rm_g16"
_WIDE = [(config, d, dtype, causal) for config in CONFIGS
         for d, dtype, causal in [(96, "bf16", True), (192, "bf16", False), (256, "fp16", True)]
         if serves(config, d, causal=causal) and (d != 96 or config in (choose_config(d, causal, 4096), _PADDED_96))]


@pytest.mark.parametrize("config,d,dtype,causal", [
    (config, *c) for config in CONFIGS
    for c in [(64, "bf16", False), (64, "bf16", True), (128, "bf16", False), (128, "fp16", True)]
    if serves(config, c[0], causal=c[2])] + _WIDE)
def test_attention_matches_torch_under_every_policy(config, d, dtype, causal):
    before, after = _pair(d, dtype, causal, config)
    for seed in range(SEEDS):
        inst = make_instance(after, seed)
        seq = run_sequential(before, inst.inputs())
        assert inst.matches(seq), (inst.desc, inst.error(seq))
        for policy in POLICIES:
            out = run_partitioned(after, inst.inputs(), policy=policy, seed=seed, nprog=2 + seed % 2)
            assert inst.matches(out), (policy, inst.desc, inst.error(out))
            assert torch.equal(out["o"], seq["o"]) and torch.equal(out["lse"], seq["lse"])  # same math, any order


def test_output_columns_past_the_head_dim_are_not_stored():
    """d=96 runs in 128-column tiles: the output store is bounded to 96 columns (``cols_valid``); without the
    bound a row's padding columns land on the next row's (or past the tensor's end)."""
    before, after = _pair(96, "bf16", False, _PADDED_96)
    (store,) = [o for o in before.body if o.kind == "store_ptr"]
    assert store.attr("cols_valid") == 96 and store.results == () and before.arg("o").dims == ("BHSq", "D")
    unbounded = replace(before, body=tuple(replace(o, attrs=tuple(a for a in o.attrs if a[0] != "cols_valid"))
                                           if o is store else o for o in before.body))
    for seed in range(3):
        inst = make_instance(after, seed, shape=(1, 2, 2, 130, 70))
        assert inst.matches(run_sequential(before, inst.inputs()))
        try:
            ok = inst.matches(run_sequential(unbounded, inst.inputs()))
        except InterpError:  # the last row's padding columns run past the output
            ok = False
        except Violation as v:  # or land on the next row, which another tile stores
            ok = v.kind != "global-race"
        assert not ok, seed


def test_fully_masked_rows_and_tiny_sequences():
    before, after = _pair(causal=True)
    for shape in [(1, 1, 1, 1, 1), (1, 2, 1, 130, 3), (2, 1, 1, 5, 200)]:
        inst = make_instance(after, 0, shape=shape)
        out = run_partitioned(after, inst.inputs(), policy="adversarial", seed=1)
        assert inst.matches(out), (shape, inst.error(out))


def test_dropped_q_release_deadlocks():
    _, after = _pair()
    q_group = next(o.attr("group") for o in walk(after.partition("consumer1").body)
                   if o.kind == "get" and o.attr("buffer").startswith("q"))
    parts = []
    for pt in after.partitions:
        if pt.name == "consumer1":
            (tiles,) = pt.body  # the tile_loop: the Q release is per tile
            kept = tuple(o for o in tiles.body if not (o.kind == "release" and o.attr("group") == q_group))
            pt = replace(pt, body=(replace(tiles, body=kept),))
        parts.append(pt)
    mutated = replace(after, partitions=tuple(parts))
    inst = make_instance(mutated, 0, shape=(2, 2, 1, 200, 100))  # 4 tiles: the producer waits to load the next Q
    for policy in POLICIES:
        with pytest.raises(Violation) as info:
            run_partitioned(mutated, inst.inputs(), policy=policy)
        assert info.value.kind == "deadlock" and f"{q_group}.empty[0]" in str(info.value)


def _edit_loop(after, part, fn):
    """``after`` with ``fn`` applied to the body (ops before the yield) of ``part``'s KV loop."""
    parts = []
    for pt in after.partitions:
        if pt.name == part:
            (tiles,) = pt.body  # the tile_loop; the KV loop is in its body
            body = list(tiles.body)
            i = next(i for i, o in enumerate(body) if o.kind == "loop")
            loop = body[i]
            body[i] = replace(loop, body=tuple(fn(list(loop.body[:-1]))) + (loop.body[-1],))
            pt = replace(pt, body=(replace(tiles, body=tuple(body)),))
        parts.append(pt)
    return replace(after, partitions=tuple(parts))


def _kinds(after):
    return violation_kinds(after, shape=(1, 1, 1, 64, 300))


def test_every_partitioned_stage_runs():
    """Each pass after code_partition leaves a complete program: the loop lowered in step order (code_partition),
    pipelined (software_pipeline), with turns (ping_pong) all compute the same numbers, under every policy."""
    trace: list = []
    pipeline.run(build(AttentionRequest(64, "bf16", True), CONFIGS["ws_p_128x128_q2_pp"]), trace=trace)
    stages = dict(trace)
    before = stages["template"]
    for seed in range(2):
        inst = make_instance(before, seed, shape=(1, 1, 1, 130, 300))
        seq = run_sequential(before, inst.inputs())
        for name in pipeline.STAGES[pipeline.STAGES.index("code_partition"):]:
            for policy in POLICIES:
                out = run_partitioned(stages[name], inst.inputs(), policy=policy, seed=seed)
                assert torch.equal(out["o"], seq["o"]) and torch.equal(out["lse"], seq["lse"]), (name, policy)


def test_pipelined_loop_structure():
    _, after = _pair(d=128, causal=True)
    loop = next(o for o in after.partition("consumer0").body[0].body if o.kind == "loop")  # in the tile_loop
    kinds = [(o.kind, o.attr("wait"), o.attr("pending"), o.attr("lag")) for o in loop.body if o.kind.startswith("mma")
             or o.attr("lag")]
    # Q K^T(j) and P V(j-1) issued back to back; Q K^T retired alone, P V at the end; slot j-1 freed
    assert kinds == [("mma", False, 0, None), ("get", None, None, 1), ("mma", False, 0, None),
                     ("mma_wait", None, 1, None), ("mma_wait", None, 0, None), ("release", None, None, 1)]


def test_scores_read_before_their_wgmma_retires():
    _, after = _pair(d=128)
    mutated = _edit_loop(after, "consumer0", lambda ops: [o.with_attrs(pending=2) if o.kind == "mma_wait"
                                                          and o.attr("pending") == 1 else o for o in ops])
    kinds = _kinds(mutated)
    assert set(kinds) == {"async-use"}, kinds  # softmax reads S while its wgmma may still write it


def test_deferred_slot_released_one_step_early():
    _, after = _pair(d=128)
    mutated = _edit_loop(after, "consumer0", lambda ops: [o.with_attrs(lag=0) if o.kind == "release" else o
                                                          for o in ops])
    kinds = _kinds(mutated)
    assert set(kinds) == {"use-after-release"}, kinds  # P V(j-1) would read V after its slot was freed



def test_ping_pong_turns_wrap_each_issue_group():
    _, after = _pair(d=128, causal=True, config="ws_p_128x128_q2_pp")
    for me, pt in enumerate(after.partitions[:2]):
        seq = [(o.kind, o.attr("me"), o.attr("to"), o.attr("wait")) for o in walk(pt.body)
               if o.kind in ("turn_wait", "turn_pass", "mma", "mma_wait")]
        w, p, m = ("turn_wait", me, None, None), ("turn_pass", None, 1 - me, None), ("mma", None, None, False)
        ret = ("mma_wait", None, None, None)
        # prologue Q K^T, steady Q K^T + P V(j-1), epilogue P V: each issued in turn, the turn handed over
        # before the partition blocks on its own wgmma
        assert seq == [w, m, p, ret, w, m, m, p, ret, ret, w, m, p, ret], seq


def test_dropped_turn_pass_deadlocks():
    _, after = _pair(config="ws_p_128x128_q2_pp")
    mutated = _edit_loop(after, "consumer1", lambda ops: [o for o in ops if o.kind != "turn_pass"])
    assert set(violation_kinds(mutated, shape=(1, 1, 1, 64, 300))) == {"deadlock"}


@pytest.mark.parametrize("tiles,nprog", [(10, 3), (12, 4), (7, 7), (5, 8), (2048, 132)])
def test_serpentine_waves_are_a_permutation(tiles, nprog):
    from torch_autows.interp.sched import cta_tiles, walked_grid

    _, after = _pair(causal=True)
    grid = walked_grid(after)  # the partitions' tile_loop
    assert grid.serpentine and grid == after.grid
    walked = [cta_tiles(grid, pid, nprog, tiles) for pid in range(nprog)]
    assert sorted(t for w in walked for t in w) == list(range(tiles))
    # wave 1 reversed: CTA 0 gets the last tile of its second wave (here the shorter causal tiles)
    if tiles >= 2 * nprog:
        assert walked[0][:2] == [0, 2 * nprog - 1]


def test_three_consumer_warpgroups():
    """data_partition=3 (192 query rows, a warpgroup per 64, as FA3 runs d=64): the same passes give three
    consumers sharing one K/V ring (the matches-torch test above runs them under every policy)."""
    for config in ("ws_p3_192x128_q2", "ws_p3_192x64_q2"):
        _, after = _pair(64, "bf16", True, config)
        assert [p.name for p in after.partitions] == ["consumer0", "consumer1", "consumer2", "producer"]
        assert {c.dsts for c in after.channels if c.buffer in ("k_smem", "v_smem")} == {
            ("consumer0", "consumer1", "consumer2")}


def test_causal_tiles_grouped_per_head():
    """group_m query tiles of a head back to back (L2 reuse of its K/V), still in serpentine waves."""
    before = build(AttentionRequest(64, "bf16", True), replace(CONFIGS["ws_p_128x128_q2"], group_m=4))
    after = pipeline.run(before)
    assert after.grid.group == 4 and after.grid.serpentine
    inst = make_instance(after, 0, shape=(2, 3, 3, 700, 700))  # 6 heads x 6 query tiles over 5 CTAs
    out = run_partitioned(after, inst.inputs(), policy="adversarial", seed=0, nprog=5)
    assert inst.matches(out), inst.error(out)


def test_turn_barriers_come_from_the_ir():
    """The interpreter makes the turn barriers from Program.turns: turn ops without it are refused, naming it."""
    from torch_autows.interp import InterpError

    _, after = _pair(config="ws_p_128x128_q2_pp")
    inst = make_instance(after, 0, shape=(1, 1, 1, 64, 300))
    with pytest.raises(InterpError, match="Program.turns"):
        run_partitioned(replace(after, turns=None), inst.inputs())
