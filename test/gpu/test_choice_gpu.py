"""The measured choice's timer on the GPU: a run's host time is not charged to its kernel (runtime.choice._time_ms)."""
from __future__ import annotations

import time

import torch

from torch_autows.runtime import choice


def test_timer_charges_the_gpu_not_the_host():
    # a ~1 ms matmul whose launch waits 3 ms on the host (as a Python launch path behind another thread's GIL):
    # do_bench's runs start after a ~0.1 ms flush, so it counts the wait; the timer queues its runs behind a sleep
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(a)

    def fast():
        return torch.mm(a, a, out=out)

    def slow_host():
        time.sleep(3e-3)
        return torch.mm(a, a, out=out)

    gpu = choice._time_ms(fast, 5, 20)
    assert 0.05 < gpu < 3
    assert abs(choice._time_ms(slow_host, 5, 20) - gpu) < 0.15 * gpu + 0.02
    from triton.testing import do_bench

    assert do_bench(slow_host, warmup=5, rep=20, return_mode="median") > gpu + 1.5  # the defect this timer avoids
