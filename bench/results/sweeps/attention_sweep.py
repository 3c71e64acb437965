"""Attention numerics sweep (test/gpu/test_sweep_gpu.py's family), cases i::S of 500 in shard i: run S at once."""
import sys
import time

sys.path.insert(0, "test")
import sweep_cases as sc
import torch

from torch_autows import config

config.choice = "autows"
i, S = int(sys.argv[1]), int(sys.argv[2])
t0 = time.time()
cases = sc.attention_cases(500, 0)[i::S]
failures, line = sc.sweep("attention", cases=cases, device="cuda")
torch.cuda.synchronize()
print(f"shard {i}/{S}: {line} in {time.time()-t0:.0f}s")
for f in failures[:20]:
    print(f)
