"""The attention backward's row-wise Triton kernels (runtime/attention_bwd_rows.py) without a GPU: run in Triton's
interpreter (a subprocess, since TRITON_INTERPRET is read when triton.jit decorates) against the torch versions in
templates/attention_bwd.py, compiled offline for sm_90a, and the dispatch that keeps the torch versions off CUDA."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from torch_autows.runtime import attention_bwd_rows as rows
from torch_autows.templates import attention_bwd as tmpl

_INTERPRETED = r"""
import torch
from torch_autows.runtime import attention_bwd_rows as rows
from torch_autows.templates import attention_bwd as tmpl

g = torch.Generator().manual_seed(0)
for d, S, view, dlse in ((64, 37, True, True), (128, 5, False, False), (64, 130, False, True), (128, 70, True, True)):
    B, H = 2, 3
    o = torch.randn(B, S, H, d, generator=g).to(torch.bfloat16).transpose(1, 2) if view else \
        torch.randn(B, H, S, d, generator=g).to(torch.bfloat16)
    do = torch.randn(B, H, S, d, generator=g).to(torch.bfloat16)
    lse = torch.randn(B, H, S, generator=g)
    lse[0, 1, S // 2] = float("-inf")
    gl = torch.randn(B, H, S, generator=g) if dlse else None
    got = rows.preprocess(o, do, lse, gl, kernel=rows._delta_kernel())
    want = tmpl.preprocess(o, do, lse, gl)
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    assert torch.equal(got[1], want[1]), "lse2"
    sqp = -(-S // 64) * 64
    acc = torch.randn(B * H * sqp, d, generator=g)
    q = torch.empty(B, H, S, d, dtype=torch.bfloat16)
    got = rows.postprocess(acc, 0.3, q, kernel=rows._dq_kernel())
    assert got.shape == q.shape and got.dtype == q.dtype and got.is_contiguous()
    # the interpreter's fp32 -> bf16 conversion truncates (the GPU's rounds to nearest: the GPU test is exact)
    torch.testing.assert_close(got.float(), tmpl.postprocess(acc, 0.3, q).float(), rtol=2 ** -7, atol=0)
print("ok")
"""


def test_kernels_interpreted_match_torch():
    """delta, lse2 (a -inf row gives 0) and dQ by the Triton kernels, interpreted on CPU, against the torch versions:
    [B, S, H, D] views of O, head dims 64/128, with and without a gradient into lse, row counts off the block."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    res = subprocess.run([sys.executable, "-c", _INTERPRETED], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr[-3000:]


@pytest.mark.parametrize("which", ["delta", "dq"])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("d", [64, 128])
def test_kernels_compile_for_sm90a(which, dtype, d):
    """Each kernel compiles offline for sm_90a with no local memory (no spills)."""
    k = rows.compile_offline(which, dtype, d)
    ptx = k.asm["ptx"]
    assert ".target sm_90a" in ptx and ".local" not in ptx


def test_off_cuda_the_torch_versions_run():
    """On CPU tensors (and without dO, or with a strided head dim) preprocess and postprocess are the torch versions'
    numbers exactly."""
    g = torch.Generator().manual_seed(1)
    o, do = (torch.randn(1, 2, 9, 64, generator=g).to(torch.bfloat16) for _ in range(2))
    lse, dlse = torch.randn(1, 2, 9, generator=g), torch.randn(1, 2, 9, generator=g)
    strided = torch.randn(1, 2, 9, 128, generator=g).to(torch.bfloat16)[..., ::2]
    for go in (do, None, strided):
        for x, y in zip(rows.preprocess(o, go, lse, dlse), tmpl.preprocess(o, go, lse, dlse)):
            assert torch.equal(x, y)
    acc = torch.randn(2 * 64, 64, generator=g)
    q = torch.empty(1, 2, 9, 64, dtype=torch.bfloat16)
    assert torch.equal(rows.postprocess(acc, 0.5, q), tmpl.postprocess(acc, 0.5, q))
