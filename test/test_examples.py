"""The example scripts run end to end on CPU (where autows falls back and says why): the harness the
H200 numbers come from keeps working, its reference comparison holds, and on CPU it times nothing and
claims no speedup. What it reports about autows does not depend on Inductor's cache state."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
TINY = ["--layers", "1", "--batch", "1", "--seq", "32", "--dim", "64", "--heads", "2"]


def _run(argv, env_extra=None, **kw):
    env = {**os.environ, "PYTHONPATH": str(EXAMPLES.parent), **(env_extra or {})}
    return subprocess.run([sys.executable, *argv], cwd=EXAMPLES, env=env, capture_output=True, text=True,
                          timeout=600, **kw)


def _autows_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith(("autows ", "  why not autows"))]


@pytest.mark.parametrize("argv", [["gpt2_block.py"], ["llama_decoder.py", "--train"],
                                  ["llama_decoder.py", "--dynamic"]])
def test_example_runs_on_cpu(argv):
    res = _run([*argv, "--device", "cpu"])
    assert res.returncode == 0, res.stderr[-3000:]
    out = res.stdout
    rows = dict(re.findall(r"^(eager|inductor|autows)\s+\S+\s+(\S+)$", out, re.M))
    assert set(rows) == {"eager", "inductor", "autows"} and all(float(v) < 1e-5 for v in rows.values()), out
    assert "speedup autows" not in out and "ms/step" not in out  # nothing timed: autows cannot run on a CPU
    assert "the generated kernels need an NVIDIA sm_90 (Hopper) GPU" in out
    assert "why not autows: tensors on cpu" in out  # the fallback is reported, not silent
    gemm = next(line for line in out.splitlines() if line.startswith("autows gemm"))
    assert "per step 0 call(s) served" in gemm and re.search(r"0 site\(s\) rewritten, [1-9]\d* left", gemm), gemm


def test_reported_sites_do_not_depend_on_the_inductor_cache(tmp_path):
    # the second run finds the first one's FX graphs in the cache: a hit skips the passes that count sites
    env = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"), "TRITON_CACHE_DIR": str(tmp_path / "triton")}
    first, second = (_run(["gpt2_block.py", "--device", "cpu", *TINY], env) for _ in range(2))
    assert first.returncode == 0 and second.returncode == 0, first.stderr[-2000:] + second.stderr[-2000:]
    lines = _autows_lines(first.stdout)
    assert any("left to Inductor" in line and " 0 left" not in line for line in lines), first.stdout
    assert _autows_lines(second.stdout) == lines


def test_cuda_on_a_cpu_only_torch_is_a_clear_error():
    import torch

    if torch.cuda.is_available():
        pytest.skip("checks the message of a machine without CUDA")
    res = _run(["llama_decoder.py", "--device", "cuda"])
    assert res.returncode != 0 and "Traceback" not in res.stderr and "AssertionError" not in res.stderr
    assert "--device cuda" in res.stderr and "--device cpu" in res.stderr


def test_hf_llama_without_transformers_says_it_did_not_run(tmp_path):
    fake = tmp_path / "transformers"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('simulated: transformers is not installed')\n")
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), str(EXAMPLES.parent)])}
    res = _run(["hf_llama.py", "--device", "cpu"], env)
    assert res.returncode == 0 and res.stdout == ""
    assert "not run" in res.stderr and "pip install transformers" in res.stderr
    assert _run(["hf_llama.py", "--help"], env).stdout.startswith("usage:")  # --help works without it


def test_timed_path_reports_median_spread_and_run_time_counts(monkeypatch, capsys):
    """The GPU branch (blocked_autorange, call counters reset before the measured steps) run on CPU by
    pretending the device can run the generated kernels; with no call served, no speedup is claimed."""
    import types

    import torch

    monkeypatch.syspath_prepend(str(EXAMPLES))
    import _common

    monkeypatch.setattr(_common, "can_run_generated", lambda device: None)
    args = types.SimpleNamespace(device="cpu", dtype="fp32", train=False, mode=None, dynamic=False, min_time=0.02)
    make_model = lambda: torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32))
    _common.run("tiny", make_model, lambda device, dtype: [torch.randn(4, 32, device=device, dtype=dtype)], args)
    out = capsys.readouterr().out
    rows = re.findall(r"^(eager|inductor|autows)\s+([\d.]+)\s+([\d.]+)\s+(\d+)\s", out, re.M)
    assert [r[0] for r in rows] == ["eager", "inductor", "autows"] and all(int(r[3]) >= 1 for r in rows), out
    assert "no speedup reported: no call ran a generated kernel" in out and "speedup autows" not in out
    assert "autows gemm     : per step 0 call(s) served" in out

    class M:  # a blocked_autorange Measurement: seconds
        def __init__(self, median, iqr):
            self.median, self.iqr, self.times = median, iqr, [median] * 5

    served = {"gemm.autows": 4.0, "attention.autows": 1.0}
    _common._report([("eager", M(3e-3, 1e-4), 0.0, 0.0), ("inductor", M(2e-3, 2e-5), 0.0, 0.0),
                     ("autows", M(1e-3, 1e-5), 0.0, 0.0)], {"gemm.rewritten": 4}, served, [], args, timed=True)
    out = capsys.readouterr().out
    assert "speedup autows vs inductor        2.00x  (medians; IQR inductor 1.0%, autows 1.0%)" in out
    assert "autows gemm     : per step 4 call(s) served by generated kernels, 0 fell back" in out
