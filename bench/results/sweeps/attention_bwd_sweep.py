"""Attention backward numerics sweep (issue 17; test/gpu/test_sweep_gpu.py's attention_bwd family), cases i::S of 240
in shard i: run S at once (``python bench/results/sweeps/attention_bwd_sweep.py i S`` from the repository root)."""
from __future__ import annotations

import sys
import time

sys.path.insert(0, "test")
import sweep_cases as sc
import torch

from torch_autows import config
from torch_autows.runtime import fallback

config.choice = "autows"
i, S = int(sys.argv[1]), int(sys.argv[2])
t0 = time.time()
cases = sc.attention_bwd_cases(240, 0)[i::S]
failures, line = sc.sweep("attention_bwd", cases=cases, device="cuda")
torch.cuda.synchronize()
counts = {k: v for k, v in fallback.counters.items() if k.startswith("attention_backward.")}
print(f"shard {i}/{S}: {line} in {time.time()-t0:.0f}s; op counters {counts}")
for f in failures[:20]:
    print(f)
