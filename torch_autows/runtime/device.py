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


def grid(tiles: int, persistent: bool, device_index: int, ctas_per_sm: int = 1) -> int:
    """CTAs to launch for ``tiles`` output tiles: one each, or for a persistent kernel ``ctas_per_sm`` per SM at most
    (each walks its tiles; Options.ctas_per_sm)."""
    return min(tiles, ctas_per_sm * num_sms(device_index)) if persistent else tiles


@functools.lru_cache(maxsize=16)
def capability(device_index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device_index)


def is_real(t) -> bool:
    """A tensor with real storage: not a fake or meta one that Inductor traces with, nor a wrapper of one (AOTAutograd
    traces a backward with functional tensors around fake ones, which have no data pointer either)."""
    from torch._subclasses.fake_tensor import is_fake

    return t.device.type != "meta" and not is_fake(t)


def sm90_reason(device: torch.device, check_device: bool = True) -> str | None:
    """Why tensors on ``device`` cannot run the generated kernels (None: they can)."""
    if device.type != "cuda":
        return f"tensors on {device.type}; the generated kernels run on CUDA sm_90 GPUs"
    if check_device:
        cap = capability(index(device))
        if cap != (9, 0):
            return f"GPU capability sm_{cap[0]}{cap[1]}; the generated kernels need sm_90 (Hopper, wgmma)"
    return None


def alignment_reason(**tensors) -> str | None:
    """The first tensor whose storage TMA cannot address (16-byte alignment); fake tensors pass."""
    for name, t in tensors.items():
        if is_real(t) and t.data_ptr() % 16:
            return f"{name} is not 16-byte aligned (TMA needs 16); make it .contiguous()"
    return None
