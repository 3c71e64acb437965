"""A numerics sweep of test/sweep_cases.py's families (test/gpu/test_sweep_gpu.py's), cases i::S of N in shard i: run S
at once from the repository root.

    python bench/results/sweeps/attention_sweep.py i S                       # attention forward, N = 500
    python bench/results/sweeps/attention_sweep.py i S attention_bwd 240     # attention backward (issue 17)
"""
import sys
import time

sys.path.insert(0, "test")
import sweep_cases as sc
import torch

from torch_autows import config
from torch_autows.runtime import fallback

config.choice = "autows"
i, S = int(sys.argv[1]), int(sys.argv[2])
family = sys.argv[3] if len(sys.argv) > 3 else "attention"
n = int(sys.argv[4]) if len(sys.argv) > 4 else 500
t0 = time.time()
cases = sc.RUNNERS[family][0](n, 0)[i::S]
failures, line = sc.sweep(family, cases=cases, device="cuda")
torch.cuda.synchronize()
op = "attention_backward" if family == "attention_bwd" else family
counts = {k: v for k, v in fallback.counters.items() if k.startswith(op + ".")}
print(f"shard {i}/{S}: {line} in {time.time()-t0:.0f}s; op counters {counts}")
for f in failures[:20]:
    print(f)
