"""The tested torch/triton range: one warning at import outside it, naming the range; silence inside it."""
from __future__ import annotations

import configparser
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from torch_autows import _compat

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setattr(_compat, "_warned", False)


@pytest.mark.parametrize("torch_v,triton_v,bad", [
    ("2.11.0+cu130", "3.6.0", []),
    ("2.13.0+cpu", "3.6.1", []),
    ("2.14.0", "3.6.0", ["torch 2.14.0 is outside the tested range torch>=2.11,<2.14"]),
    ("2.14.0a0+git1234", "3.6.0", ["torch 2.14.0a0+git1234 is outside"]),
    ("2.10.1", "3.7.0", ["torch 2.10.1 is outside", "triton 3.7.0 is outside the tested range triton>=3.6,<3.7"]),
    ("2.12.0", None, ["triton is not importable (tested: triton>=3.6,<3.7)"]),
    ("weird", "3.6.0", ["torch weird is outside"]),
])
def test_untested(torch_v, triton_v, bad):
    problems = _compat.untested({"torch": torch_v, "triton": triton_v})
    assert len(problems) == len(bad) and all(p.startswith(b) for p, b in zip(problems, bad))


def test_warns_once_naming_the_range(fresh):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert _compat.warn_if_untested({"torch": "2.15.0", "triton": "3.6.0"})
        assert not _compat.warn_if_untested({"torch": "2.15.0", "triton": "3.8.0"})  # once per process
    assert len(caught) == 1 and issubclass(caught[0].category, _compat.UntestedVersionWarning)
    msg = str(caught[0].message)
    assert "torch 2.15.0 is outside the tested range torch>=2.11,<2.14" in msg and "triton>=3.6,<3.7" in msg


def test_no_warning_inside_the_range(fresh):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not _compat.warn_if_untested({"torch": "2.13.0+cpu", "triton": "3.6.0"})


def test_import_warns_for_an_untested_torch():
    code = "import torch; torch.__version__ = '2.15.0'; import torch_autows"
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "default"})
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stderr.count("UntestedVersionWarning") == 1 and "torch>=2.11,<2.14" in res.stderr


def test_range_matches_setup_cfg():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    requires = [r.strip() for r in cfg["options"]["install_requires"].splitlines() if r.strip()]
    for name in _compat.TESTED:
        assert _compat.spec(name) in requires, (name, requires)
    assert cfg["metadata"]["license"] == "BSD-3-Clause" and (ROOT / cfg["metadata"]["license_files"]).exists()
    assert "matplotlib" in cfg["options.extras_require"]["bench"]
