"""Every config the runtime can pick, partitioned and interpreted under every policy, equals torch.

The configs run at their real tile sizes (no shrinking: the interpreter is fast enough), so the
structure under test (data_partition, persistent, ring depth after memory_plan, SMEM reuse) is exactly
what the runtime compiles. Inputs are multiples of 1/4, so every correct schedule is bit-exact.
Each (config, variant) runs 20 seeds of each policy on 2 simulated persistent CTAs (one CTA per tile
when not persistent), each seed a different small shape with tails in M, N and K.
"""
from __future__ import annotations

import pytest
import torch

from torch_autows.interp import POLICIES, interpret_report, make_instance, run_partitioned, run_sequential
from torch_autows.passes import pipeline
from torch_autows.runtime.gemm import CONFIGS, serves_swap
from torch_autows.templates.gemm import GemmRequest, build

VARIANTS = {
    "nn": {},
    "ta_bias": {"trans_a": True, "bias": True},
    "tb_f32out": {"trans_b": True, "out_dtype": "f32"},
    "tt_fp16": {"trans_a": True, "trans_b": True, "dtype": "fp16", "bias": True},
    "batch_fp16": {"batch": 3, "dtype": "fp16"},
}
SEEDS = 20


def _served(config: str, variant: str) -> bool:
    """bmm never splits K; a swap-AB config serves nn.Linear's layout (a row-major, b transposed) only."""
    kw = VARIANTS[variant]
    return ("batch" not in kw or CONFIGS[config].split_k == 1) and serves_swap(
        config, trans_a=kw.get("trans_a", False), trans_b=kw.get("trans_b", False), batched="batch" in kw)


@pytest.mark.parametrize("config,variant", [(c, v) for c in CONFIGS for v in VARIANTS if _served(c, v)])
def test_config_matches_torch_under_every_policy(config, variant):
    before = build(GemmRequest(1, 1, 1, **VARIANTS[variant]), CONFIGS[config])
    after = pipeline.run(before)
    for seed in range(SEEDS):
        inst = make_instance(after, seed)
        assert torch.equal(run_sequential(before, inst.inputs())["c"], inst.reference["c"]), inst.desc
        for policy in POLICIES:
            stats: dict = {}
            out = run_partitioned(after, inst.inputs(), policy=policy, seed=seed, nprog=2 + seed % 2, stats=stats)
            assert torch.equal(out["c"], inst.reference["c"]), (policy, seed, inst.desc)
            assert stats["steps"] > 0


def test_interpret_report_for_every_config():
    for opts in CONFIGS.values():
        before = build(GemmRequest(1, 1, 1, bias=True, trans_b=opts.swap_ab), opts)
        ok, report = interpret_report(before, pipeline.run(before), seeds=2)
        assert ok, report
        assert "result: OK" in report and "partitioned adversarial" in report and "max |err| vs torch 0" in report
