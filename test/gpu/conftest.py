from __future__ import annotations

import pytest
import torch


def _sm90() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def pytest_collection_modifyitems(config, items):
    if _sm90():
        return
    skip = pytest.mark.skip(reason="needs a CUDA sm_90 GPU (H100/H200)")
    for item in items:
        if "test/gpu" in str(item.fspath).replace("\\", "/"):
            item.add_marker(skip)
