"""The main job: python -m torch_autows explain gemm ... --compile."""
from __future__ import annotations

import json
import subprocess
import sys

from torch_autows.__main__ import main


def test_explain_gemm_compile_prints_every_pass_gluon_and_summary(capsys):
    assert main(["explain", "gemm", "--m", "4096", "--n", "4096", "--k", "4096", "--dtype", "bf16", "--compile"]) == 0
    out = capsys.readouterr().out
    steps = ["template", "data_partition", "loop_schedule", "partition_schedule", "buffers", "memory_plan",
             "code_partition"]
    pos = 0
    for s in steps + ["generated Gluon"]:
        pos = out.index(s, pos)
    last = out.strip().splitlines()[-1]
    assert last.startswith("summary: ")
    summary = json.loads(last[len("summary: "):])
    assert [p["name"] for p in summary["partitions"]] == ["consumer0", "consumer1", "producer"]
    assert summary["wgmma"] > 0 and summary["setmaxnreg"] > 0 and summary["spills"] == 0
    assert summary["smem_bytes"] <= 232448


def test_explain_attention_compile(capsys):
    argv = ["explain", "attention", "--b", "4", "--h", "16", "--s", "4096", "--d", "128", "--causal", "--compile"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "# ---- IR after code_partition ----" in out and "def producer(" in out
    summary = json.loads(out.strip().splitlines()[-1][len("summary: "):])
    assert len(summary["partitions"]) == 3 and summary["smem_bytes"] <= 232448


def test_explain_attention_unsupported_head_dim():
    r = subprocess.run([sys.executable, "-m", "torch_autows", "explain", "attention", "--d", "96"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "head dim 96 not served" in r.stderr


def test_explain_attention_config_for_another_head_dim():
    r = subprocess.run([sys.executable, "-m", "torch_autows", "explain", "attention", "--d", "128", "--config",
                        "ws_p3_192x64_q2"], capture_output=True, text=True)
    assert r.returncode == 2 and "serves head dims (64,), not 128" in r.stderr


def test_explain_unknown_config():
    assert main(["explain", "gemm", "--m", "8", "--n", "8", "--k", "8", "--config", "nope"]) == 2


def test_explain_interpret_runs_both_semantics(capsys):
    assert main(["explain", "attention", "--d", "64", "--causal", "--interpret", "--seeds", "1"]) == 0
    out = capsys.readouterr().out
    assert "sequential (before partitioning)" in out and "partitioned adversarial" in out
    assert "no schedule violation" in out
