"""Tile consumers (``Options.tile_consumers``: consumer c runs the CTA's tiles j % 2 == c) interpreted under every
policy and several seeds: ragged M, N and K with an odd number of tiles per CTA (one consumer runs one more), CTAs
with one tile (the second consumer runs none) and more CTAs than tiles; and the mutations the interpreter must
catch: a consumer at the other's ring position, a lap off (wrong phase), the main loops without their turns."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from torch_autows.interp import POLICIES, Violation, interpret_report, make_instance, run_partitioned
from torch_autows.ir import op
from torch_autows.passes import pipeline
from torch_autows.runtime.gemm import CONFIGS
from torch_autows.templates.gemm import GemmRequest, build

SEEDS = 4


def _shapes(config):
    """(M, N, K, nprog): ragged everywhere, K steps past the ring's depth; tiles per CTA odd, one, or none."""
    o = CONFIGS[config]
    bm, bn, bk = o.block_m, o.block_n, o.block_k
    k = 7 * bk - 24  # 7 steps: the ring (4-5 slots) wraps inside a tile
    return [(5 * bm - 24, bn - 8, k, 2),  # 5 tiles on 2 CTAs: 3 (consumer0 runs 2, consumer1 1) and 2
            (3 * bm - 40, bn - 8, k, 2),  # 3 tiles: CTA 1 has one tile, its consumer1 none
            (2 * bm - 8, 2 * bn - 40, bk - 8, 1),  # 4 tiles of one K step on one CTA: the ring wraps across tiles
            (bm - 8, 3 * bn - 16, k, 5)]  # 3 tiles, 5 SMs: a CTA per tile, no consumer1 work at all


@pytest.mark.parametrize("config", ["ws_pp2_128x128", "ws_pp2_64x256"])
@pytest.mark.parametrize("variant", [{}, {"trans_a": True, "bias": True}, {"trans_b": True, "out_dtype": "f32",
                                                                           "dtype": "fp16"}])
def test_matches_torch_under_every_policy(config, variant):
    before = build(GemmRequest(1, 1, 1, **variant), CONFIGS[config])
    after = pipeline.run(before)
    for m, n, k, nprog in _shapes(config):
        ok, report = interpret_report(before, after, seeds=SEEDS, nprog=nprog, shape=(m, n, k))
        assert ok, report


def _outcomes(program, config, seeds=SEEDS) -> list[str]:
    """Per (shape, policy, seed): the violation kind, 'wrong' for outputs that differ from torch, else 'ok'."""
    out = []
    for m, n, k, nprog in _shapes(config)[:2]:
        for policy in POLICIES:
            for seed in range(seeds):
                inst = make_instance(program, seed, shape=(m, n, k))
                try:
                    res = run_partitioned(program, inst.inputs(), policy=policy, seed=seed, nprog=nprog)
                except Violation as v:
                    out.append(v.kind)
                    continue
                out.append("ok" if torch.equal(res["c"], inst.reference["c"]) else "wrong")
    return out


def _edit(p, part, fn):
    def one(pt):
        (tl,) = pt.body
        return replace(pt, body=(replace(tl, body=tuple(fn(tl.body))),))
    return replace(p, partitions=tuple(one(pt) if pt.name == part else pt for pt in p.partitions))


def _program(config="ws_pp2_128x128"):
    return pipeline.run(build(GemmRequest(1, 1, 1), CONFIGS[config]))


def test_unmutated_program_passes_the_same_runs():
    assert set(_outcomes(_program(), "ws_pp2_128x128")) == {"ok"}


def test_consumer_reading_the_other_consumers_slot_is_caught():
    # consumer1 one fill behind its tile: its first wait is for consumer0's last fill of the tile before
    bad = _edit(_program(), "consumer1", lambda ops: [o.with_attrs(per_tile="cdiv(K,64)-1") if o.kind == "seek"
                                                      else o for o in ops])
    kinds = _outcomes(bad, "ws_pp2_128x128")
    assert "ok" not in kinds and "wrong" not in kinds and "shared-fill" in kinds, kinds


def test_consumer_at_the_first_fills_is_caught():
    bad = _edit(_program(), "consumer1", lambda ops: [o.with_attrs(per_tile="0") if o.kind == "seek" else o
                                                      for o in ops])
    kinds = _outcomes(bad, "ws_pp2_128x128")
    assert "ok" not in kinds and "wrong" not in kinds, kinds


def test_consumer_without_its_seek_is_caught():
    bad = _edit(_program(), "consumer1", lambda ops: [o for o in ops if o.kind != "seek"])
    kinds = _outcomes(bad, "ws_pp2_128x128")
    assert "ok" not in kinds, kinds


def test_consumer_a_lap_off_is_caught():
    # same slots, the opposite phase: consumer1's counter a whole ring ahead of the fills of its tile
    p = _program()
    lap = tuple(op("advance", group="g0") for _ in range(p.groups[0].count))
    bad = _edit(p, "consumer1", lambda ops: [x for o in ops for x in ((o, *lap) if o.kind == "seek" else (o,))])
    kinds = _outcomes(bad, "ws_pp2_128x128")
    assert "ok" not in kinds, kinds


def test_main_loops_without_their_turns_wait_a_lap_early():
    # what the first build did: consumer1 jumps to tile 1's fills before tile 0's have landed, and a parity wait on
    # a slot two phases behind passes at once
    p = _program()
    bad = replace(p, turns=None)
    for part in ("consumer0", "consumer1"):
        bad = _edit(bad, part, lambda ops: [o for o in ops if o.kind not in ("turn_wait", "turn_pass")])
    kinds = _outcomes(bad, "ws_pp2_128x128")
    # every round-robin and random run fails; an adversarial order may happen to keep consumer1 behind
    assert set(kinds[:2 * SEEDS]) == {"wrong-phase"} and "wrong" not in kinds, kinds
