"""The custom ops ``torch.ops.autows.{attention,gemm,bmm}`` under their Inductor-side name.

They are defined and registered in ``torch_autows.custom_ops`` (loaded by ``import torch_autows``, no
Inductor needed); this module keeps the names the Inductor glue imports (``attention_impl``, ``gemm_into``,
...). The ops' Inductor lowerings are in lowering.py.
"""
from __future__ import annotations

from ..custom_ops import attention, attention_impl, bmm, gemm, gemm_into, run_gemm

__all__ = ["attention", "attention_impl", "bmm", "gemm", "gemm_into", "run_gemm"]
