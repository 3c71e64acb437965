"""GPU tests skip without an sm_90 GPU. ``TORCH_AUTOWS_TEST_SHARD=i/n`` keeps every n-th GPU test
starting at i, so n processes can share the Triton compiles of a fresh machine (each test case
config is a kernel of its own)."""
from __future__ import annotations

import os

import pytest
import torch


def _sm90() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def pytest_collection_modifyitems(config, items):
    if _sm90():
        shard = os.environ.get("TORCH_AUTOWS_TEST_SHARD")
        if shard:
            i, n = (int(x) for x in shard.split("/"))
            gpu = [it for it in items if "test/gpu" in str(it.fspath).replace("\\", "/")]
            keep = set(gpu[i::n])
            config.hook.pytest_deselected(items=[it for it in gpu if it not in keep])
            items[:] = [it for it in items if it in keep or it not in gpu]
        return
    skip = pytest.mark.skip(reason="needs a CUDA sm_90 GPU (H100/H200)")
    for item in items:
        if "test/gpu" in str(item.fspath).replace("\\", "/"):
            item.add_marker(skip)


@pytest.fixture
def repeated_split_launches():
    """``check(run, shape, ref, tol)``: three launches of a split-K kernel (``run(out)`` writes into a NaN-poisoned
    bf16 ``out`` of ``shape``) are bitwise equal (the reduction's order is fixed), within ``tol`` relative norm
    error of ``ref``."""

    def check(run, shape, ref, tol):
        outs = []
        for _ in range(3):
            out = torch.full(shape, float("nan"), device="cuda", dtype=torch.bfloat16)
            run(out)
            outs.append(out)
        torch.cuda.synchronize()
        assert ((outs[0].float() - ref).norm() / ref.norm().clamp_min(1e-6)).item() < tol
        assert all(torch.equal(outs[0], o) for o in outs[1:])

    return check
