"""`python -m torch_autows.bench ... --dry-run` and argument handling (no GPU)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from torch_autows.bench import cases
from torch_autows.bench.__main__ import main

REPO_ROOT = Path(__file__).resolve().parents[2]


def _run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_gemm_dry_run_lists_the_gemm_set(capsys):
    rc, out, _ = _run(capsys, "gemm", "--dry-run")
    assert rc == 0
    for name in ["4096x4096x4096", "8192x8192x8192", "8192x4096x4096", "8192x14336x4096", "8192x4096x14336",
                 "16384x1024x4096", "4096x128256x4096", "bmm:32x2048x2048x128", "addmm:8192x4096x4096",
                 "fp16:4096x4096x4096"]:
        assert f"  {name} " in out
    assert "12 case(s)" in out
    for peer in ["cublas", "inductor-max-autotune", "triton-autows", "autows"]:
        assert f"  {peer} " in out
    assert ("gluon-reference" in out) or ("gluon-reference skipped" in out)
    assert "137.4 GFLOP" in out  # 2*4096^3


def test_attention_dry_run_grid(capsys):
    rc, out, _ = _run(capsys, "attention", "--dry-run")
    # 28 of head dims 64/128, 18 of 96/192/256, 10 Llama-3.1 GQA 64/8, 6 MLA prefill (q/k 192, v 128)
    assert rc == 0 and "62 case(s)" in out
    assert "s4096-d192v128-causal " in out and "B=4 Hq=16 Hkv=16 S=4096 D=192 Dv=128 causal=True" in out
    assert "  efficient " in out
    assert "s4096-d96-causal " in out and "B=4 Hq=16 Hkv=16 S=4096 D=96 causal=True" in out
    assert "s512-d64 " in out and "B=32 Hq=32 Hkv=32 S=512 D=64 causal=False" in out
    assert "s16384-d128-causal" in out and "B=1 Hq=16 Hkv=16 S=16384 D=128 causal=True" in out
    assert "gqa32x8-s8192-d128" in out and "B=2 Hq=32 Hkv=8" in out
    assert "gqa64x8-s32768-d128-causal" in out and "B=1 Hq=64 Hkv=8 S=32768 D=128 causal=True" in out
    for peer in ["cudnn", "fa2", "flex", "triton-autows", "autows"]:
        assert f"  {peer} " in out


def test_model_dry_run(capsys):
    rc, out, _ = _run(capsys, "model", "--dry-run", "--layers", "2")
    assert rc == 0 and "8x2048" in out and "1x16384" in out and "2 layers" in out
    for peer in ["eager", "inductor", "inductor-max-autotune", "autows"]:
        assert f"  {peer} " in out


def test_quick_shapes_peers_repeat(capsys):
    rc, out, _ = _run(capsys, "attention", "--quick", "--dry-run", "--peers", "cudnn,autows", "--repeat", "3")
    assert rc == 0 and f"{len(cases.QUICK['attention'])} case(s), 2 peer(s)" in out and "x 3 round(s)" in out
    rc, out, _ = _run(capsys, "gemm", "--shapes", "fp16:*,4096x4096x4096", "--dry-run")
    assert rc == 0 and "4 case(s)" in out
    rc, out, _ = _run(capsys, "model", "--cases", "1x16384", "--dry-run")
    assert rc == 0 and "1 case(s)" in out and "8x2048" not in out


@pytest.mark.parametrize("argv,msg", [
    (["gemm", "--shapes", "1x2x3", "--dry-run"], "no gemm case matches '1x2x3'"),
    (["attention", "--peers", "cudnn,nope", "--dry-run"], "unknown or unavailable peer(s) nope"),
    (["model", "--repeat", "0", "--dry-run"], "--repeat must be >= 1"),
])
def test_bad_arguments(capsys, argv, msg):
    rc, _, err = _run(capsys, *argv)
    assert rc == 2 and msg in err


def test_quick_names_exist():
    for work, names in cases.QUICK.items():
        assert len(cases.select(work, quick=True)) == len(names)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_measuring_without_cuda_fails_cleanly(capsys, tmp_path):
    rc, _, err = _run(capsys, "gemm", "--quick", "--out", str(tmp_path), "--md", str(tmp_path / "B.md"))
    assert rc == 2 and "no CUDA device" in err and not list(tmp_path.iterdir())


def test_report_subcommand(capsys, tmp_path):
    rc, out, _ = _run(capsys, "report", "--out", str(tmp_path / "results"), "--md", str(tmp_path / "B.md"))
    assert rc == 0 and (tmp_path / "B.md").read_text().startswith("# Benchmarks")


def test_module_entry_point_from_another_directory(tmp_path):
    """``python -m torch_autows.bench`` from elsewhere: --out is honoured, the dry run writes nothing."""
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    argv = [sys.executable, "-m", "torch_autows.bench", "model", "--dry-run", "--out", str(tmp_path / "x")]
    res = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "model: 2 case(s), 4 peer(s)" in res.stdout
    assert f"output: {tmp_path / 'x'}/<date>-<gpu>-model.json + .png; then {tmp_path / 'BENCHMARKS.md'}" in res.stdout
    assert not list(tmp_path.iterdir())


def test_help_points_to_the_bench_readme(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "torch_autows/bench/README.md" in out and "shared/" not in out and "./bench/results" in out
    assert (REPO_ROOT / "torch_autows" / "bench" / "README.md").exists()


def test_model_timing_defaults_take_several_long_rounds():
    # a model forward takes ~50 ms: do_bench's 100 ms default would time it about twice
    from torch_autows.bench.__main__ import build_parser

    model = build_parser().parse_args(["model"])
    assert (model.repeat, model.warmup, model.rep) == (3, 200, 1000)
    gemm = build_parser().parse_args(["gemm"])
    assert (gemm.repeat, gemm.warmup, gemm.rep) == (1, 25, 100)
