"""The on-disk cache (diskcache) and load_module: concurrency, entries checked against their key, unusable roots.

The sources here are plain Python modules that define ``kernel`` (load_module only needs that); they are made
large so that a reader racing a non-atomic writer would see a partial file, and unique per test (uuid) so that
no earlier load in the process is reused.
"""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import threading
import uuid

import pytest
from fs_paths import unwritable

from torch_autows import config, diagnostics, diskcache
from torch_autows.codegen import compile as cc


def _source(tag: str, value: int = 1, pad: int = 4000) -> str:
    """A module of ~250 kB whose ``kernel()`` returns ``value``; ``kernel`` is defined last."""
    lines = [f"# autows test module {tag}"] + [f"# padding line {i:05d} " + "x" * 48 for i in range(pad)]
    return "\n".join(lines) + f"\n\ndef kernel():\n    return {value}\n"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh cache root for this test; nothing loaded earlier in the process is reused."""
    root = tmp_path / "cache"
    monkeypatch.setattr(config, "cache_dir", str(root))
    monkeypatch.setattr(cc, "_modules", {})
    monkeypatch.setattr(cc, "_private", None)
    return root


def _entry(root, source: str) -> str:
    return os.path.join(root, f"autows_{cc.source_key(source)}.py")


def _load_together(src: str, n: int = 4) -> tuple[list, list[str]]:
    """``load_module(src)`` from ``n`` threads released together: (modules, errors)."""
    barrier = threading.Barrier(n)
    mods, errors = [None] * n, []

    def work(i):
        barrier.wait()
        try:
            mods[i] = cc.load_module(src)
        except Exception as e:  # collected, asserted by the caller
            errors.append(f"{type(e).__name__}: {e}")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return mods, errors


def test_threads_load_one_new_source(cache, monkeypatch):
    """4 threads behind a barrier load one new source into an empty cache, 30 times: no error, one module
    per trial and it has ``kernel`` (before: shared <path>.<pid>.tmp, FileNotFoundError and half-written
    modules kept by lru_cache)."""
    for t in range(30):
        root = cache / f"t{t}"
        monkeypatch.setattr(config, "cache_dir", str(root))
        src = _source(f"threads {uuid.uuid4()}", value=t)
        mods, errors = _load_together(src)
        assert not errors, (t, errors)
        assert all(m is mods[0] for m in mods) and mods[0].kernel() == t
        assert os.listdir(root) == [os.path.basename(_entry(root, src))]  # no temporary file left


_CHILD = textwrap.dedent("""
    import os, sys, time
    from torch_autows import config
    from torch_autows.codegen import compile as cc
    config.cache_dir, ready = sys.argv[1], sys.argv[2]
    sources = [open(p, newline="").read() for p in sys.argv[3:]]
    open(os.path.join(ready, str(os.getpid())), "w").close()
    deadline = time.time() + 60
    while len(os.listdir(ready)) < 2 and time.time() < deadline:  # both start loading at the same moment
        time.sleep(0.001)
    for i, s in enumerate(sources):
        assert cc.load_module(s).kernel() == i, i
    print("ok", len(sources))
""")


def test_two_processes_share_one_cache_dir(tmp_path):
    """Two processes load the same 20 new sources into one empty cache dir at once: both succeed, each
    entry holds its source and no temporary file is left."""
    root, ready = tmp_path / "shared", tmp_path / "ready"
    ready.mkdir()
    paths = []
    for i in range(20):
        p = tmp_path / f"src{i}.py.txt"
        p.write_text(_source(f"procs {uuid.uuid4()}", value=i), newline="")
        paths.append(str(p))
    procs = [subprocess.Popen([sys.executable, "-c", _CHILD, str(root), str(ready), *paths], cwd=os.getcwd(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=180) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0 and out.strip() == "ok 20", err[-2000:]
    sources = [open(p, newline="").read() for p in paths]
    assert sorted(os.listdir(root)) == sorted(os.path.basename(_entry(root, s)) for s in sources)
    for s in sources:
        assert diskcache.read_text(_entry(root, s)) == s


def _tampered(src: str) -> str:
    return src.replace("return 1\n", "return 666\n")


@pytest.mark.parametrize("damage", [
    lambda s: os.urandom(3000),                       # corrupted: random bytes (SyntaxError before)
    lambda s: s[: len(s) // 2].encode(),              # truncated: no kernel (AttributeError before)
    lambda s: b"",                                    # empty (AttributeError before)
    lambda s: _tampered(s).encode(),                  # tampered but valid: a different kernel (used as is before)
    lambda s: (s + "# TAMPERED\n").encode(),          # a comment appended
], ids=["corrupted", "truncated", "empty", "tampered", "appended"])
def test_bad_entry_is_detected_and_rebuilt(cache, caplog, damage):
    src = _source(f"damage {uuid.uuid4()}")
    os.makedirs(cache)
    path = _entry(cache, src)
    with open(path, "wb") as f:
        f.write(damage(src))
    with caplog.at_level(logging.WARNING, logger="torch_autows"):
        mod = cc.load_module(src)
    assert mod.kernel() == 1
    assert diskcache.read_text(path) == src
    assert any("does not hold the source its name hashes" in r.getMessage() for r in caplog.records)


def test_entry_changed_between_check_and_import_is_rewritten(cache, monkeypatch, caplog):
    """Another writer replaces the entry after it was checked: the import sees it, rewrites, loads again."""
    src = _source(f"race {uuid.uuid4()}")
    real, calls = cc._import, []

    def racing_import(source, key, path):
        calls.append(path)
        if len(calls) == 1:
            with open(path, "w") as f:
                f.write(_tampered(source))
        return real(source, key, path)

    monkeypatch.setattr(cc, "_import", racing_import)
    with caplog.at_level(logging.WARNING, logger="torch_autows"):
        assert cc.load_module(src).kernel() == 1
    assert len(calls) == 2 and diskcache.read_text(calls[0]) == src
    assert any("failed to load" in r.getMessage() for r in caplog.records)


def test_a_module_that_failed_to_load_is_not_kept(cache):
    flag = f"_autows_test_ok_{uuid.uuid4().hex}"
    src = f"import builtins\nif not getattr(builtins, {flag!r}, False):\n    raise RuntimeError('boom')\n" \
          "def kernel():\n    return 7\n"
    name = f"torch_autows_generated_{cc.source_key(src)}"
    with pytest.raises(RuntimeError, match="boom"):
        cc.load_module(src)
    assert name not in sys.modules
    import builtins

    setattr(builtins, flag, True)
    try:
        assert cc.load_module(src).kernel() == 7
    finally:
        delattr(builtins, flag)


@pytest.mark.parametrize("kind", ["file", "file/sub", "read-only"])
def test_unusable_root_falls_back_to_a_private_dir(tmp_path, monkeypatch, caplog, kind):
    bad = unwritable(tmp_path, kind)
    monkeypatch.setattr(config, "cache_dir", bad)
    monkeypatch.setattr(cc, "_modules", {})
    monkeypatch.setattr(cc, "_private", None)
    diagnostics.faults.reset()
    src = _source(f"unusable {uuid.uuid4()}")
    with caplog.at_level(logging.WARNING, logger="torch_autows"):
        assert diskcache.root() is None
        assert diskcache.root() is None
        mod = cc.load_module(src)
    assert mod.kernel() == 1
    assert os.path.dirname(mod.__file__) == cc._private and not mod.__file__.startswith(bad)
    assert diskcache.read_text(mod.__file__) == src
    assert sum("is unusable" in r.getMessage() for r in caplog.records) == 1  # warned once


def test_inductor_cache_dir_is_honoured(tmp_path, monkeypatch):
    monkeypatch.setattr(config, "cache_dir", None)
    monkeypatch.setattr(cc, "_modules", {})
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    assert diskcache.root() == str(tmp_path / "inductor" / "autows")
    src = _source(f"inductor {uuid.uuid4()}")
    assert cc.load_module(src).__file__ == _entry(tmp_path / "inductor" / "autows", src)
    monkeypatch.setattr(config, "cache_dir", str(tmp_path / "mine"))  # TORCH_AUTOWS_CACHE_DIR wins
    assert diskcache.root() == str(tmp_path / "mine") and os.path.isdir(tmp_path / "mine")


def test_atomic_write_and_read_text(tmp_path, caplog):
    p = str(tmp_path / "f.txt")
    assert diskcache.read_text(p) is None
    assert diskcache.atomic_write(p, "a\r\nb\n") and diskcache.read_text(p) == "a\r\nb\n"  # exact text
    assert diskcache.atomic_write(p, b"\xff\xfe") and diskcache.read_text(p) is None       # not UTF-8
    with caplog.at_level(logging.WARNING, logger="torch_autows"):
        assert diskcache.atomic_write(str(tmp_path / "missing" / "f.txt"), "x") is False   # no OSError
    assert any("could not write" in r.getMessage() for r in caplog.records)
    assert sorted(os.listdir(tmp_path)) == ["f.txt"]  # no temporary file left


def test_diskcache_imports_nothing_heavy():
    """The module alone (no package around it) loads with the standard library only: torch._inductor is
    imported by root(), when it is called, not at import."""
    code = ("import importlib.util, sys; spec = importlib.util.spec_from_file_location('dc', sys.argv[1]); "
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); "
            "print(sorted(m for m in sys.modules if m.startswith(('torch', 'triton'))))")
    out = subprocess.run([sys.executable, "-c", code, diskcache.__file__], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr[-2000:]
