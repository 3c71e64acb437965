"""passes/cross_tile under the partitioned interpreter: several tiles per CTA (fewer persistent CTAs than tiles),
causal or not, ragged lengths, d 64 (K and V in one ring) and 128 (rings of their own), against the sequential
semantics of the program before the passes; and a broken carry between tiles is caught."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from torch_autows.interp import POLICIES, make_instance, run_partitioned, run_sequential
from torch_autows.ir import walk
from torch_autows.passes import pipeline
from torch_autows.runtime.attention import CONFIGS
from torch_autows.templates.attention import AttentionRequest, build

XT = "ws_p_128x128_q2_rm_g16_xt"
SHAPES = [(2, 2, 1, 133, 262), (1, 3, 1, 300, 45), (3, 1, 1, 1, 129)]  # (batch, Hq, G, Sq, Skv): 3-9 tiles


def _pair(d, causal, opts):
    before = build(AttentionRequest(d, "bf16", causal), opts)
    after = pipeline.run(before)
    assert sum(o.kind == "tile_next" for pt in after.partitions for o in walk(pt.body)) == opts.data_partition
    return before, after


@pytest.mark.parametrize("d,causal,opts", [
    (128, True, CONFIGS[XT]), (128, False, CONFIGS[XT]), (64, True, CONFIGS[XT]), (64, False, CONFIGS[XT]),
    # three consumers, 64 keys a step, P V deferred: the pass applies there too
    (64, True, replace(CONFIGS["ws_p3_192x64_q2"], cross_tile=True))])
def test_cross_tile_matches_the_sequential_program(d, causal, opts):
    before, after = _pair(d, causal, opts)
    for seed, shape in enumerate(SHAPES):
        inst = make_instance(after, seed, shape=shape)
        seq = run_sequential(before, inst.inputs())
        assert inst.matches(seq), (inst.desc, inst.error(seq))
        for policy in POLICIES:
            out = run_partitioned(after, inst.inputs(), policy=policy, seed=seed, nprog=2)
            assert torch.equal(out["o"], seq["o"]) and torch.equal(out["lse"], seq["lse"]), (policy, inst.desc)


def _edit_step(after, fn):
    """``after`` with ``fn(tile_next op) -> op`` applied to every partition's tile_next."""
    parts = []
    for pt in after.partitions:
        (tl,) = pt.body
        body = tuple(fn(o) if o.kind == "tile_next" else o for o in tl.body)
        parts.append(replace(pt, body=(replace(tl, body=body),)))
    return replace(after, partitions=tuple(parts))


def _wrong(program, shape=(2, 2, 1, 133, 262)) -> list[bool]:
    """Per policy: does the run give other outputs than the sequential semantics (or raise)?"""
    inst = make_instance(program, 0, shape=shape)
    ref = run_sequential(build(AttentionRequest(128, "bf16", True), CONFIGS[XT]), inst.inputs())
    out = []
    for policy in POLICIES:
        try:
            got = run_partitioned(program, inst.inputs(), policy=policy, seed=0, nprog=2)
            out.append(not (torch.equal(got["o"], ref["o"]) and torch.equal(got["lse"], ref["lse"])))
        except Exception:  # a violation is caught too
            out.append(True)
    return out


def test_a_broken_carry_is_caught():
    _, after = _pair(128, True, CONFIGS[XT])
    assert _wrong(after) == [False] * len(POLICIES)  # unmutated: right

    def stale_acc(nx):  # the step yields the tile's incoming accumulator instead of the next tile's
        y = nx.body[-1]
        its = nx.attr("iter_args")
        acc = next(i for i, n in enumerate(its) if n.startswith("acc"))
        ops = list(y.operands)
        ops[acc] = its[acc]
        return replace(nx, body=(*nx.body[:-1], replace(y, operands=tuple(ops))))
    assert all(_wrong(_edit_step(after, stale_acc)))

    def current_indices(nx):  # the previous tile's stores at the next tile's indices
        body = tuple(replace(o, attrs=tuple((k, v.replace("_prev", "") if isinstance(v, str) else v)
                                            for k, v in o.attrs)) for o in nx.body)
        return replace(nx, body=body)
    assert all(_wrong(_edit_step(after, current_indices)))
