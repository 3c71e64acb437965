"""Random numerics sweep on sm_90: TORCH_AUTOWS_SWEEP_N (default 500; 240 for the backward) seeded
configurations per kernel family.

Families: GEMM (ops.gemm: M 1..300, odd N/K, bias, fp32 output, transposed operands, shapes the runtime refuses
and torch runs), bmm, and the attention forward (ops.attention: B, Hq, Hkv with GQA, Sq != Skv, odd lengths,
causal, d 64/96/128/256 and 32/80 (they fall back), bf16/fp16, default / positive / negative / zero scale,
[B, S, H, D] and fused-QKV views), and the attention backward (issue 17; 240 cases by default: d 64/128, bf16/fp16,
GQA groups 1/2/4/8, Sq = Skv or not, odd lengths, causal, [B, S, H, D] views, a gradient into lse, none into out,
atomic or separate dQ). Each forward case is checked through the public op and, where the generated kernel serves it,
through the runtime into NaN-poisoned out= / lse= buffers, against an fp32 torch reference (test/sweep_cases.py):
relative norm error 1e-2 for bf16/fp16 outputs, and NaN/inf exactly where torch has them (about 15% of the
cases get a NaN or inf input). Each backward case is checked through attention_grad.attention_backward (generated
backward on) and runtime.attention_bwd.backward in its dQ form with NaN-poisoned gradients, against attention_grad's
fp32 math backward: relative norm error within max(2 x cuDNN's / flash's error on the same inputs, 1e-2) per
gradient plus 1e-4 per element, no NaN. Every failure names its case and seed (TORCH_AUTOWS_SWEEP_SEED, default 0).

Each family prints ``sweep <family>: N configs, F failures (...)`` to the terminal, captured or not. Budget:
about 30 kernel compiles and 1500 launches a family (the backward: 24 compiles), a few minutes on a fresh H200
(sizes are moderate; kernels take their sizes at run time). TORCH_AUTOWS_SWEEP_SHARD=i/n runs one shard (the
attention families split by head dim: n processes on one GPU compile disjoint kernels side by side).
"""
from __future__ import annotations

import pytest
import sweep_cases as sc
import torch

from torch_autows.runtime import fallback


@pytest.mark.parametrize("family", ["gemm", "bmm", "attention", "attention_bwd"])
def test_sweep(family, capsys):
    fallback.reset()
    failures, line = sc.sweep(family, None, sc.SEED, device="cuda")  # the family's count: N, or BWD_N
    torch.cuda.synchronize()
    op = {"attention_bwd": "attention_backward"}.get(family, family)
    counts = {k: v for k, v in fallback.counters.items() if k.startswith(op + ".")}
    with capsys.disabled():
        print(f"\n{line}; op counters {counts}")
    assert not failures, f"{line}\n" + "\n".join(failures[:20])
    # every backward draw is servable: a fallback would have compared torch's gradients with themselves
    assert family != "attention_bwd" or not counts.get("attention_backward.fallback"), counts
