"""The example scripts run end to end on CPU (where autows falls back and says why): the harness the
H200 numbers come from keeps working, and its reference comparison holds."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.mark.parametrize("argv", [["gpt2_block.py"], ["llama_decoder.py", "--train", "--iters", "1"],
                                  ["llama_decoder.py", "--dynamic", "--iters", "1"]])
def test_example_runs_on_cpu(argv):
    env = {**os.environ, "PYTHONPATH": str(EXAMPLES.parent)}
    res = subprocess.run([sys.executable, *argv, "--device", "cpu"], cwd=EXAMPLES, env=env, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    out = res.stdout
    rows = dict(re.findall(r"^(eager|inductor|autows)\s+[\d.]+\s+\S+\s+(\S+)$", out, re.M))
    assert set(rows) == {"eager", "inductor", "autows"} and all(float(v) < 1e-5 for v in rows.values()), out
    assert "speedup autows vs inductor" in out
    assert "why not autows: tensors on cpu" in out  # the fallback is reported, not silent
