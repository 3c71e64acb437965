"""Attention Programs through both semantics: every runtime config (d 64/128, causal or not, bf16/fp16)
under every policy, against an fp32 softmax reference; plus the attention op kinds and one mutation.

Tile sizes are the runtime's (no shrinking). Each seed is a fresh shape: 1-2 batches, GQA groups 1-2,
ragged Sq and Skv (partial KV tiles are masked, partial query tiles are not stored).
"""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from torch_autows.interp import POLICIES, Violation, make_instance, run_partitioned, run_sequential
from torch_autows.ir import walk
from torch_autows.passes import pipeline
from torch_autows.runtime.attention import CONFIGS
from torch_autows.templates.attention import AttentionRequest, build

SEEDS = 10


def _pair(d=64, dtype="bf16", causal=False, config="ws_p_128x128"):
    before = build(AttentionRequest(d, dtype, causal), CONFIGS[config])
    return before, pipeline.run(before)


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("d,dtype,causal", [(64, "bf16", False), (64, "bf16", True), (128, "bf16", False),
                                            (128, "fp16", True)])
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
            pt = replace(pt, body=tuple(o for o in pt.body if not (o.kind == "release" and o.attr("group") == q_group)))
        parts.append(pt)
    mutated = replace(after, partitions=tuple(parts))
    inst = make_instance(mutated, 0, shape=(2, 2, 1, 200, 100))  # 4 tiles: the producer waits to load the next Q
    for policy in POLICIES:
        with pytest.raises(Violation) as info:
            run_partitioned(mutated, inst.inputs(), policy=policy)
        assert info.value.kind == "deadlock" and f"{q_group}.empty[0]" in str(info.value)
