"""torch_autows.config: strict environment parsing, the unknown-name warning, patch(), the TORCH_AUTOWS switch,
and the torch_autows logger under TORCH_LOGS (torch_autows/_logging.py).

Import-time behaviour is checked two ways: the module's code re-run in a fresh namespace
(``runpy.run_path``, cheap, under a monkeypatched environment) and, end to end, ``import torch_autows`` in
a subprocess.
"""
from __future__ import annotations

import os
import runpy
import subprocess
import sys
import warnings

import pytest

from torch_autows import _logging, config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_AUTOWS") and k != "TORCH_LOGS"}
    return {**env, **extra}


def _python(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env=_clean_env(**env))


def _load(monkeypatch, **env) -> dict:
    """The config module's globals after running its code with ``env`` (and no other TORCH_AUTOWS_*)."""
    for k in list(os.environ):
        if k.startswith("TORCH_AUTOWS"):
            monkeypatch.delenv(k)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return runpy.run_path(config.__file__)


TRUE = ["1", "true", "TRUE", "True", "yes", "YES", "on", "On", " 1", "true\n", "\tyes ", " ON "]
FALSE = ["0", "false", "FALSE", "no", "No", "off", "OFF", " 0 ", "false\t", "\nno"]
BAD = ["", " ", "maybe", "disabled", "n", "y", "2", "-1", "tru", "enable", "1.0", "nope"]


@pytest.mark.parametrize("value", TRUE)
def test_parse_bool_true(value):
    assert config.parse_bool("X", value) is True


@pytest.mark.parametrize("value", FALSE)
def test_parse_bool_false(value):
    assert config.parse_bool("X", value) is False


@pytest.mark.parametrize("value", BAD)
def test_parse_bool_rejects(value):
    with pytest.raises(ValueError) as e:
        config.parse_bool("TORCH_AUTOWS_GEMM", value)
    msg = str(e.value)
    assert f"TORCH_AUTOWS_GEMM={value!r}" in msg and "1/0, true/false, yes/no, on/off" in msg


@pytest.mark.parametrize("setting", ["gemm", "attention", "debug"])
def test_boolean_settings_at_import(monkeypatch, setting):
    var = "TORCH_AUTOWS_" + setting.upper()
    assert _load(monkeypatch, **{var: " Off "})[setting] is False
    assert _load(monkeypatch, **{var: "YES"})[setting] is True
    for bad in ("disabled", "maybe", ""):
        with pytest.raises(ValueError, match=f"{var}={bad!r} is not a boolean"):
            _load(monkeypatch, **{var: bad})


def test_defaults_at_import(monkeypatch):
    g = _load(monkeypatch)
    assert (g["gemm"], g["attention"], g["debug"]) == (True, True, False)
    assert g["dump_dir"] is None and g["cache_dir"] is None and g["choice"] == "measure"


def test_pretending_a_target_is_not_a_product_setting(monkeypatch):
    """The test-only "CPU graphs count as sm_90" switch lives in inductor/support.py (``_pretend_target``, set by
    test fixtures), not in the settings: no environment variable, no ``patch`` name, not in the snapshot."""
    with pytest.warns(UserWarning, match="TORCH_AUTOWS_PRETEND_SM90 is not read by torch_autows"):
        g = _load(monkeypatch, TORCH_AUTOWS_PRETEND_SM90="1")
    assert "pretend_sm90" not in g and not any("pretend" in k for k in config.snapshot())
    with pytest.raises(AttributeError, match="no setting 'pretend_sm90'"):
        config.patch(pretend_sm90=True)


@pytest.mark.parametrize("value,expect", [(" ", None), ("", None), ("\t\n", None), ("out", "out"),
                                          ("/tmp/a b", "/tmp/a b")])
def test_directories_blank_is_unset(monkeypatch, value, expect):
    g = _load(monkeypatch, TORCH_AUTOWS_DUMP=value, TORCH_AUTOWS_CACHE_DIR=value)
    assert g["dump_dir"] == expect and g["cache_dir"] == expect


def test_choice(monkeypatch):
    for v in ("measure", "prior", " AUTOWS ", "vendor"):
        assert _load(monkeypatch, TORCH_AUTOWS_CHOICE=v)["choice"] == v.strip().lower()
    for bad in ("", "fastest", "torch"):
        with pytest.raises(ValueError, match="is not one of measure, prior, autows, vendor"):
            _load(monkeypatch, TORCH_AUTOWS_CHOICE=bad)


def test_unknown_names_warn_with_the_closest_known(monkeypatch):
    with pytest.warns(UserWarning) as rec:
        _load(monkeypatch, TORCH_AUTOWS_GEMMS="0", TORCH_AUTOWS_ATENTION="0", TORCH_AUTOWS_XYZZY="1")
    msgs = sorted(str(w.message) for w in rec)
    assert len(msgs) == 3
    assert "TORCH_AUTOWS_ATENTION is not read by torch_autows" in msgs[0] and "TORCH_AUTOWS_ATTENTION?" in msgs[0]
    assert "TORCH_AUTOWS_GEMMS" in msgs[1] and "did you mean TORCH_AUTOWS_GEMM?" in msgs[1]
    assert "TORCH_AUTOWS_XYZZY" in msgs[2] and "known: TORCH_AUTOWS, TORCH_AUTOWS_ATTENTION" in msgs[2]


def test_known_and_unrelated_names_do_not_warn(monkeypatch):
    env = {v: "0" for v in config.ENV_VARS if v not in ("TORCH_AUTOWS_CHOICE", "TORCH_AUTOWS_ATTENTION_BACKWARD")}
    env.update(TORCH_AUTOWS_CHOICE="prior", TORCH_AUTOWS_ATTENTION_BACKWARD="autows", TORCH_AUTOWSX="1",
               TORCHINDUCTOR_FOO="1")
    env.update(TORCH_AUTOWS_DUMP="d", TORCH_AUTOWS_CACHE_DIR="c")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _load(monkeypatch, **env)


def test_patch_context_manager_restores():
    before = config.snapshot()
    with config.patch(gemm=False, choice="prior") as p:
        assert config.gemm is False and config.choice == "prior"
        assert config.snapshot() == {**before, "gemm": False, "choice": "prior"}
        with p:  # re-entrant: the inner exit restores the outer values
            config.gemm = True
        assert config.gemm is False
    assert config.snapshot() == before
    with pytest.raises(RuntimeError), config.patch({"attention": False}):
        assert config.attention is False
        raise RuntimeError("restored on errors too")
    assert config.snapshot() == before


def test_patch_decorator():
    seen, before = [], (config.debug, config.dump_dir)

    @config.patch(debug=not config.debug, dump_dir="/tmp/x")
    def f(n):
        seen.append((config.debug, config.dump_dir))
        if n:
            f(n - 1)
        return n

    assert f(1) == 1 and seen == [(not before[0], "/tmp/x")] * 2
    assert (config.debug, config.dump_dir) == before


def test_patch_rejects_unknown_names_and_bad_values():
    before = config.snapshot()
    with pytest.raises(AttributeError, match="no setting 'gemms'; did you mean 'gemm'\\?"):
        config.patch(gemms=False)
    with pytest.raises(AttributeError, match="settings: dump_dir, debug"):
        config.patch(zzz=1)
    with pytest.raises(ValueError, match="config.gemm must be a bool, got 'off'"):
        config.patch(gemm="off")
    with pytest.raises(ValueError, match="config.choice must be one of 'measure'"):
        config.patch(choice="fast")
    assert config.snapshot() == before


def test_plain_assignment_still_works(monkeypatch):
    monkeypatch.setattr(config, "attention", False)
    assert config.snapshot()["attention"] is False


def test_import_fails_naming_the_variable():
    r = _python("import torch_autows", TORCH_AUTOWS_GEMM="disabled")
    assert r.returncode != 0
    assert "ValueError: TORCH_AUTOWS_GEMM='disabled' is not a boolean; use one of 1/0" in r.stderr


def test_import_warns_once_and_reads_the_rest():
    code = "import torch_autows as t; print(repr(t.config.dump_dir), t.config.gemm, t.config.choice)"
    r = _python(code, TORCH_AUTOWS_GEMMS="0", TORCH_AUTOWS_DUMP=" ", TORCH_AUTOWS_GEMM="No",
                TORCH_AUTOWS_CHOICE="vendor")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["None", "False", "vendor"]
    assert r.stderr.count("TORCH_AUTOWS_GEMMS is not read by torch_autows") == 1
    assert "did you mean TORCH_AUTOWS_GEMM?" in r.stderr


def test_enable_switch_is_strict():
    r = _python("import torch_autows", TORCH_AUTOWS="garbage")
    assert r.returncode != 0 and "ValueError: TORCH_AUTOWS='garbage' is not a boolean" in r.stderr
    r = _python("import torch_autows\nfrom torch_autows.inductor import api\nprint(api.enabled())",
                TORCH_AUTOWS=" On ")
    assert r.returncode == 0 and r.stdout.strip() == "True", r.stderr


@pytest.mark.parametrize("value,expect", [
    ("autows", "torch_autows"), ("+autows", "+torch_autows"), ("-autows", "-torch_autows"),
    ("dynamo, +autows", "dynamo, +torch_autows"), ("autows,inductor", "torch_autows,inductor"),
    ("torch_autows", None), ("+torch_autows", None), ("autows_x", None), ("dynamo", None), ("", None)])
def test_rewrite_torch_logs(value, expect):
    env = {"TORCH_LOGS": value}
    assert _logging.rewrite_torch_logs(env) is (expect is not None)
    assert env["TORCH_LOGS"] == (value if expect is None else expect)


_LOG = ("import logging, torch_autows\nlog = logging.getLogger('torch_autows')\n"
        "log.debug('DBG-LINE'); log.info('INFO-LINE')")


@pytest.mark.parametrize("spelling,debug,info", [("+autows", True, True), ("autows", False, True),
                                                 ("torch_autows", False, True)])
def test_torch_logs_spellings(spelling, debug, info):
    r = _python(_LOG, TORCH_LOGS=spelling)
    assert r.returncode == 0, r.stderr[-2000:]
    assert ("DBG-LINE" in r.stderr) is debug and ("INFO-LINE" in r.stderr) is info


def test_set_logs_knows_the_alias():
    code = "import logging, torch, torch_autows\ntorch._logging.set_logs(modules={'autows': logging.DEBUG})\n"
    r = _python(code + _LOG)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "DBG-LINE" in r.stderr and "INFO-LINE" in r.stderr
