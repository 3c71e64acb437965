"""Filesystem faults never escape: an unusable TORCH_AUTOWS_DUMP is warned about and skipped, and on the kernel
path an OSError while building or compiling a kernel makes the op fall back to torch with the reason logged.

The GPU path is emulated on CPU as in test_bound_launch.py: the device checks pass, and ``Launcher._slow``
(the first launch, which compiles through Triton) is replaced.
"""
from __future__ import annotations

import errno
import logging
import os
import tempfile

import pytest
import torch
from fs_paths import unwritable

from torch_autows import config, diagnostics, ops
from torch_autows.codegen import compile as cc
from torch_autows.passes import pipeline
from torch_autows.runtime import attention as rta
from torch_autows.runtime import device as dev
from torch_autows.runtime import fallback, launch
from torch_autows.runtime import gemm as rtg
from torch_autows.templates.gemm import GemmRequest, build


@pytest.mark.parametrize("kind", ["file", "file/sub", "read-only"])
def test_unusable_dump_dir_warns_once_and_the_pipeline_goes_on(tmp_path, monkeypatch, caplog, kind):
    bad = unwritable(tmp_path, kind)
    monkeypatch.setattr(config, "dump_dir", bad)
    diagnostics.faults.reset()
    template = build(GemmRequest(1, 1, 1, "bf16", "bf16", False, False, False), rtg.CONFIGS["ws_p_128x128"])
    with caplog.at_level(logging.WARNING, logger="torch_autows"):
        program = pipeline.run(template)
    assert program.partitions and all(p.body for p in program.partitions)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and bad in warnings[0].getMessage(), [r.getMessage() for r in warnings]


def test_dump_dir_gets_every_step(tmp_path, monkeypatch):
    monkeypatch.setattr(config, "dump_dir", str(tmp_path / "dump" / "nested"))
    pipeline.run(build(GemmRequest(1, 1, 1, "bf16", "bf16", False, False, False), rtg.CONFIGS["ws_p_128x128"]))
    names = sorted(os.listdir(tmp_path / "dump" / "nested"))
    assert len(names) == len(pipeline.PIPELINE) + 1 and names[-1].endswith(
        f".{len(pipeline.PIPELINE):02d}.{pipeline.STAGES[-1]}.ir"), names


@pytest.fixture
def fake_gpu(monkeypatch):
    """CPU tensors pass the device checks; the first launch (compile) is recorded instead of run; nothing
    loaded or planned earlier in the process is reused."""
    launches = []

    def slow(self, grid, args, key, first):
        launches.append(grid)

    monkeypatch.setattr(launch.Launcher, "_slow", slow)
    monkeypatch.setattr(dev, "sm90_reason", lambda device, check_device=True: None)
    monkeypatch.setattr(dev, "index", lambda device: 0)
    monkeypatch.setattr(dev, "num_sms", lambda i: 132)
    monkeypatch.setattr(cc, "_modules", {})
    monkeypatch.setattr(cc, "_private", None)
    monkeypatch.setattr(config, "gemm", True)
    monkeypatch.setattr(config, "attention", True)
    _forget()
    yield launches
    _forget()


def _forget():
    for rt in (rtg, rta):
        rt._BOUND.clear()
    launch.compile_kernel.cache_clear()


def _gemm_inputs():
    return torch.randn(256, 64).bfloat16(), torch.randn(64, 128).bfloat16()


def _attention_inputs():
    return [torch.randn(1, 2, 128, 64).bfloat16() for _ in range(3)]


def _no_cache_anywhere(tmp_path, monkeypatch):
    """The cache root is a regular file and no private temporary directory can be made either."""
    monkeypatch.setattr(config, "cache_dir", unwritable(tmp_path, "file"))

    def no_tmp(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", tempfile.gettempdir())

    monkeypatch.setattr(tempfile, "mkdtemp", no_tmp)


def _fell_back(op: str, caplog, before: int, needle: str) -> None:
    assert fallback.counters[f"{op}.fallback"] == before + 1
    assert any(f"autows {op}: falling back to torch" in r.getMessage() and needle in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]


def test_gemm_with_no_writable_cache_falls_back_with_the_reason(fake_gpu, tmp_path, monkeypatch, caplog):
    _no_cache_anywhere(tmp_path, monkeypatch)
    a, b = _gemm_inputs()
    before = fallback.counters["gemm.fallback"]
    with caplog.at_level(logging.WARNING, logger="torch_autows"):
        out = ops.gemm(a, b)
    torch.testing.assert_close(out, a @ b)
    assert fake_gpu == []  # nothing was launched
    _fell_back("gemm", caplog, before, "could not build the kernel: cannot write the generated kernel source")


def test_attention_with_no_writable_cache_falls_back_with_the_reason(fake_gpu, tmp_path, monkeypatch, caplog):
    _no_cache_anywhere(tmp_path, monkeypatch)
    q, k, v = _attention_inputs()
    before = fallback.counters["attention.fallback"]
    with caplog.at_level(logging.WARNING, logger="torch_autows"):
        out, _ = ops.attention(q, k, v, is_causal=True)
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)
    assert fake_gpu == []
    _fell_back("attention", caplog, before, "could not build the kernel")


def test_compile_oserror_at_first_launch_falls_back(fake_gpu, tmp_path, monkeypatch, caplog):
    """Triton compiles at the first launch; a cache it cannot write (OSError) is a fallback, not a crash."""
    monkeypatch.setattr(config, "cache_dir", str(tmp_path / "cache"))

    def slow(self, grid, args, key, first):
        raise OSError(errno.EROFS, "Read-only file system", "/triton/cache")

    monkeypatch.setattr(launch.Launcher, "_slow", slow)
    a, b = _gemm_inputs()
    before = fallback.counters["gemm.fallback"]
    with caplog.at_level(logging.WARNING, logger="torch_autows"):
        torch.testing.assert_close(ops.gemm(a, b), a @ b)
    _fell_back("gemm", caplog, before, "could not compile the kernel")
    q, k, v = _attention_inputs()
    before = fallback.counters["attention.fallback"]
    with caplog.at_level(logging.WARNING, logger="torch_autows"):
        ops.attention(q, k, v)
    _fell_back("attention", caplog, before, "could not compile the kernel")


@pytest.mark.parametrize("what", ["cache", "dump"])
def test_kernel_path_still_launches_with_an_unusable_cache_or_dump_dir(fake_gpu, tmp_path, monkeypatch, what):
    """An unusable cache root (the source goes to a private temp dir) or dump dir does not stop the kernel."""
    monkeypatch.setattr(config, "cache_dir", unwritable(tmp_path, "file") if what == "cache" else
                        str(tmp_path / "cache"))
    monkeypatch.setattr(config, "dump_dir", unwritable(tmp_path, "file/sub") if what == "dump" else None)
    a, b = _gemm_inputs()
    served = fallback.counters["gemm.autows"]
    ops.gemm(a, b)  # the launch is recorded, not run: the output is not checked
    assert fallback.counters["gemm.autows"] == served + 1 and fake_gpu == [2]  # 2x1 tiles of 128x128
    if what == "cache":
        assert cc._private is not None and any(n.startswith("autows_") for n in os.listdir(cc._private))
