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
    want = tmpl.preprocess(o, do, lse, gl)
    sqp = -(-S // 64) * 64
    for ws in (None, torch.full((B * H * S, d), float("nan")), torch.full((B * H * sqp, d), float("nan"))):
        got = rows.preprocess(o, do, lse, gl, kernel=rows._delta_kernel(), workspace=ws)
        torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
        assert torch.equal(got[1], want[1]), "lse2"
        assert ws is None or torch.equal(ws, torch.zeros_like(ws)), "workspace not zeroed"
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
    [B, S, H, D] views of O, head dims 64/128, with and without a gradient into lse, row counts off the block; the
    delta kernel without a workspace and zeroing a NaN-filled one of S or of padded rows per head (every row)."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    res = subprocess.run([sys.executable, "-c", _INTERPRETED], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr[-3000:]


@pytest.mark.parametrize("which", ["delta", "delta_nozero", "dq"])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("d", [64, 128])
def test_kernels_compile_for_sm90a(which, dtype, d):
    """Each kernel compiles offline for sm_90a with no local memory (no spills); the delta kernel has stores beside
    delta's and lse2's only where it zeroes a workspace."""
    k = rows.compile_offline(which.split("_")[0], dtype, d, zero=which == "delta")
    ptx = k.asm["ptx"]
    assert ".target sm_90a" in ptx and ".local" not in ptx
    if which == "delta":  # the zero stores: the workspace's [BLOCK, D] tile beside delta's and lse2's rows
        plain = rows.compile_offline("delta", dtype, d, zero=False).asm["ptx"]
        assert ptx.count("st.global") > plain.count("st.global") >= 2


def test_workspace_checked():
    """A workspace of the wrong dtype, width or row count is refused with what to pass instead."""
    o = torch.randn(1, 2, 9, 64).to(torch.bfloat16)
    lse = torch.randn(1, 2, 9)
    bads = (torch.empty(18, 64, dtype=torch.float16), torch.empty(18, 32), torch.empty(19, 64), torch.empty(16, 64))
    for bad in bads:
        with pytest.raises(ValueError, match="workspace"):
            rows.preprocess(o, o, lse, workspace=bad)
    ws = torch.full((2 * 64, 64), float("nan"))
    rows.preprocess(o, o, lse, workspace=ws)  # off CUDA: the torch versions, the workspace zeroed
    assert torch.equal(ws, torch.zeros_like(ws))


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
