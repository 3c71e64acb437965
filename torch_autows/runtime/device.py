"""Device facts the runtimes need on every call, cached per device: SM count and compute capability;
and whether a tensor has real storage (support checks also run on Inductor's fake tensors)."""
from __future__ import annotations

import functools

import torch


def index(device: torch.device) -> int:
    """The CUDA device index of ``device`` ("cuda" alone means the current device)."""
    return device.index if device.index is not None else torch.cuda.current_device()


@functools.lru_cache(maxsize=16)
def num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


@functools.lru_cache(maxsize=16)
def capability(device_index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device_index)


def is_real(t) -> bool:
    """A tensor with real storage (not a fake/meta one that Inductor traces with)."""
    from torch._subclasses.fake_tensor import FakeTensor

    return not isinstance(t, FakeTensor) and t.device.type != "meta"
