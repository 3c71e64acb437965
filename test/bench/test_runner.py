"""The measuring loop on CPU with fake peers and a fake do_bench: checks, failures, timing, spread."""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import triton.testing

from torch_autows.bench import runner
from torch_autows.bench.runner import Bound, Peer, Ref, Skip, Suite
from torch_autows.runtime import fallback

_T0 = time.time()


@dataclass(frozen=True)
class FakeCase:
    name: str = "64x32x16"
    flops: float = 2.0 * 64 * 32 * 16
    dtype: str = "bf16"


def _inputs(case):
    torch.manual_seed(0)
    return {"a": torch.randn(64, 16, dtype=torch.bfloat16), "b": torch.randn(16, 32, dtype=torch.bfloat16)}


def _ref(case, inp):
    return Ref(inp["a"].float() @ inp["b"].float())


def _prealloc(write):
    def bind(case, inp):
        out = torch.empty(64, 32, dtype=torch.bfloat16)
        return Bound(lambda: write(inp, out) or out, out=out)

    return bind


def _good_write(inp, out):
    out.copy_(inp["a"] @ inp["b"])


def _partial_write(inp, out):
    out[:32].copy_((inp["a"] @ inp["b"])[:32])  # leaves the poisoned rows


def _raise(*a):
    raise RuntimeError("PassManager::run failed\nreproducer follows")


def _skip(case, inp):
    raise Skip("not for this case")


def _autows(serve: bool):
    def bind(case, inp):
        def fn():
            (fallback.note_served if serve else lambda op: fallback.note_fallback(op, "shape not served"))("gemm")
            return inp["a"] @ inp["b"]

        return Bound(fn, counters=("gemm",))

    return bind


PEERS = [
    Peer("good", _prealloc(_good_write)),
    Peer("partial", _prealloc(_partial_write)),
    Peer("wrong", lambda c, i: Bound(lambda: i["a"] @ i["b"] + 5.0)),
    Peer("bind-crash", _raise),
    Peer("run-crash", lambda c, i: Bound(_raise)),
    Peer("skipped", _skip),
    Peer("autows-fallback", _autows(False)),
    Peer("autows", _autows(True)),
]


@pytest.fixture
def fake_bench(monkeypatch):
    times = itertools.cycle([0.010, 0.011, 0.009])
    calls = []

    def do_bench(fn, warmup=25, rep=100, return_mode="mean"):
        assert return_mode == "median"
        fn()
        calls.append(fn)
        return next(times)

    monkeypatch.setattr(triton.testing, "do_bench", do_bench)
    fallback.reset()
    return calls


def test_run_case_records_every_outcome(fake_bench):
    suite = Suite("gemm", [FakeCase()], PEERS, _inputs, _ref)
    rows = {r["impl"]: r for r in runner.run_case(suite, FakeCase(), repeat=3)}
    assert list(rows) == ["good", "partial", "wrong", "bind-crash", "run-crash", "autows-fallback", "autows"]
    good = rows["good"]
    assert good["error"] is None and good["ms"] == pytest.approx(0.010)
    assert good["tflops"] == pytest.approx(FakeCase.flops / 0.010e-3 / 1e12)
    assert good["spread"] == pytest.approx(0.2) and len(good["samples_ms"]) == 3
    assert good["rel_err"] < 1e-2
    assert "NaN/Inf" in rows["partial"]["error"] and rows["partial"]["tflops"] is None
    assert rows["wrong"]["error"].startswith("rel_err") and rows["wrong"]["rel_err"] > 1e-2
    assert rows["wrong"]["ms"] is None
    assert rows["bind-crash"]["error"] == "RuntimeError: PassManager::run failed reproducer follows"
    assert rows["run-crash"]["error"].startswith("RuntimeError")
    assert rows["autows-fallback"]["error"] == "fell back to torch: shape not served"  # the logged reason
    assert rows["autows"]["error"] is None and rows["autows"]["tflops"] > 0
    assert len(fake_bench) == 3 * 2  # only the two passing peers are timed, 3 rounds each


def test_first_passing_peer_is_reference_when_none(fake_bench):
    suite = Suite("gemm", [FakeCase()], [PEERS[3], PEERS[0], PEERS[2], PEERS[7]], _inputs, lambda c, i: None)
    rows = {r["impl"]: r for r in runner.run_case(suite, FakeCase())}
    assert rows["good"]["rel_err"] == 0.0 and "reference" in rows["good"]["note"]
    assert rows["wrong"]["error"].startswith("rel_err")  # compared against "good"
    assert rows["autows"]["error"] is None and "reference: good output" in rows["autows"]["note"]
    assert "spread" not in rows["good"]


def test_inputs_failure_fails_every_peer(fake_bench):
    def boom(case):
        raise MemoryError("CUDA out of memory")

    suite = Suite("gemm", [FakeCase()], PEERS[:2], boom, _ref)
    rows = runner.run_case(suite, FakeCase())
    assert [r["error"] for r in rows] == ["inputs/reference: MemoryError: CUDA out of memory"] * 2


def test_run_suite_calls_back_after_each_case(fake_bench):
    cases = [FakeCase("a"), FakeCase("b")]
    seen = []
    suite = Suite("gemm", cases, PEERS[:1] + PEERS[7:], _inputs, _ref, before_case=lambda: seen.append("reset"))
    rows = runner.run_suite(suite, on_case=lambda rs: seen.append(len(rs)))
    assert seen == ["reset", 2, "reset", 4]
    assert [r["case"] for r in rows] == ["a", "a", "b", "b"]


def test_lse_is_checked(fake_bench):
    def bind(case, inp):
        out = inp["a"] @ inp["b"]
        return Bound(lambda: (out, torch.ones(64)), counters=())

    def ref(case, inp):
        return Ref(inp["a"].float() @ inp["b"].float(), lse=torch.full((64,), 2.0))

    rows = runner.run_case(Suite("attention", [FakeCase()], [Peer("x", bind)], _inputs, ref), FakeCase())
    assert rows[0]["error"].startswith("lse rel_err")


def test_real_gemm_and_attention_peers_on_cpu(fake_bench, monkeypatch):
    """The real peer bindings on tiny CPU cases: cuBLAS-path torch ops pass; autows cannot serve CPU
    tensors, so its row must be failed (fell back, or an error) and never timed; GPU-only peers error out."""
    from torch_autows.bench import cases, peers_attention, peers_gemm

    monkeypatch.setattr(peers_gemm, "DEVICE", "cpu")
    monkeypatch.setattr(peers_attention, "DEVICE", "cpu")
    gpeers = {p.name: p for p in peers_gemm.all_peers()[0]}
    for case in [cases.GemmCase("mm", 64, 48, 32), cases.GemmCase("addmm", 64, 48, 32),
                 cases.GemmCase("bmm", 32, 16, 8, batch=3, dtype="fp16")]:
        suite = peers_gemm.suite([case], [gpeers["cublas"], gpeers["triton-autows"], gpeers["autows"]])
        rows = {r["impl"]: r for r in runner.run_case(suite, case)}
        assert rows["cublas"]["error"] is None and rows["cublas"]["rel_err"] < 1e-2, rows["cublas"]
        assert rows["triton-autows"]["error"] and rows["triton-autows"]["tflops"] is None
        assert rows["autows"]["error"] and rows["autows"]["tflops"] is None
    apeers = {p.name: p for p in peers_attention.all_peers()[0]}
    case = cases.AttnCase(2, 4, 2, 64, 16, causal=True)
    suite = peers_attention.suite([case], [apeers["cudnn"], apeers["autows"]])
    rows = {r["impl"]: r for r in runner.run_case(suite, case)}
    assert rows["cudnn"]["error"]  # no cuDNN kernel for CPU tensors
    assert rows["autows"]["error"] and rows["autows"]["tflops"] is None


def _fake_cli(monkeypatch, written: list | None = None):
    """The CLI's measuring path on CPU: a fake GPU, fake meta, the fake peers good / wrong / autows."""
    import types

    from torch_autows.bench import __main__ as cli
    from torch_autows.bench import results

    if written is not None:
        real_write = results.write_json
        monkeypatch.setattr(results, "write_json", lambda p, m, r: written.append(len(r)) or real_write(p, m, r))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(runner, "_sync", lambda: None)
    monkeypatch.setattr(results, "collect_meta", lambda work, argv, **kw: {
        "subcommand": work, "date": "2026-11-30", "timestamp": "2026-11-30T10:00:00+00:00", "gpu": "NVIDIA H200",
        "sm_count": 132, "command": "python -m torch_autows.bench " + " ".join(argv), **kw})
    fake = types.SimpleNamespace(suite=lambda cs, ps: Suite("gemm", cs, ps, _inputs, _ref))
    peers = [PEERS[0], PEERS[2], PEERS[7]]
    monkeypatch.setattr(cli, "peers_of", lambda work: (fake, peers, ["gluon-reference skipped: test"]))
    return cli


def test_cli_run_path_with_fake_gpu(fake_bench, monkeypatch, tmp_path, capsys):
    """The measuring CLI path (meta, JSON rewritten per case, table, PNG, BENCHMARKS.md) with CPU fake peers."""
    import json

    written = []
    cli = _fake_cli(monkeypatch, written)
    out, md = tmp_path / "results", tmp_path / "BENCHMARKS.md"
    argv = ["gemm", "--shapes", "4096x4096x4096,8192x8192x8192", "--out", str(out), "--md", str(md)]
    assert cli.main(argv) == 0
    stdout = capsys.readouterr().out
    assert "autows/best other: geomean" in stdout
    assert "- wrong on 2 cases (4096x4096x4096, 8192x8192x8192): rel_err" in stdout  # one line per message
    path = out / "2026-11-30-h200-gemm.json"
    data = json.loads(path.read_text())
    assert data["meta"]["complete"] is True and data["meta"]["skipped_peers"] == ["gluon-reference skipped: test"]
    assert [r["case"] for r in data["rows"]] == ["4096x4096x4096"] * 3 + ["8192x8192x8192"] * 3
    assert written[:2] == [3, 6]  # rewritten after each case
    assert path.with_suffix(".png").exists() and "### 2026-11-30-h200-gemm" in md.read_text()
    assert cli.main(argv + ["--no-report"]) == 0
    assert (out / "2026-11-30-h200-gemm-2.json").exists()


def test_cli_default_output_is_under_the_cwd_never_the_package(fake_bench, monkeypatch, tmp_path, capsys):
    """Installed, the package's parent is site-packages: results and BENCHMARKS.md go to ./bench/results and
    ./BENCHMARKS.md of the current directory, and nothing is written next to the package."""
    from torch_autows.bench import results

    site = tmp_path / "site-packages"
    site.mkdir()
    monkeypatch.setattr(results, "REPO_ROOT", site)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    cli = _fake_cli(monkeypatch)
    assert cli.main(["gemm", "--shapes", "4096x4096x4096"]) == 0
    assert (work / "bench" / "results" / "2026-11-30-h200-gemm.json").exists()
    assert "### 2026-11-30-h200-gemm" in (work / "BENCHMARKS.md").read_text()
    assert not list(site.iterdir())
    pkg = Path(cli.__file__).resolve().parents[1]  # the package this test imports: untouched as well
    assert not [p for p in pkg.rglob("*") if p.suffix in (".json", ".png", ".md") and p.stat().st_mtime > _T0]
    # --out elsewhere: BENCHMARKS.md beside that folder unless --markdown says otherwise
    assert cli.main(["gemm", "--shapes", "4096x4096x4096", "--out", str(tmp_path / "x")]) == 0
    assert (tmp_path / "x" / "2026-11-30-h200-gemm.json").exists() and (tmp_path / "BENCHMARKS.md").exists()
    assert cli.main(["report", "--out", str(tmp_path / "x"), "--markdown", str(tmp_path / "md" / "B.md")]) == 0
    assert (tmp_path / "md" / "B.md").read_text().startswith("# Benchmarks")


def test_cli_run_without_matplotlib_keeps_the_results(fake_bench, monkeypatch, tmp_path, capsys):
    """matplotlib is an extra: a run that measured everything writes JSON and BENCHMARKS.md and notes the
    skipped plot in one line instead of crashing after the measurement."""
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    cli = _fake_cli(monkeypatch)
    out, md = tmp_path / "results", tmp_path / "BENCHMARKS.md"
    assert cli.main(["gemm", "--shapes", "4096x4096x4096", "--out", str(out), "--md", str(md)]) == 0
    err = capsys.readouterr().err
    assert (out / "2026-11-30-h200-gemm.json").exists() and not (out / "2026-11-30-h200-gemm.png").exists()
    assert md.exists() and "[plot](" not in md.read_text()
    notes = [line for line in err.splitlines() if "plot skipped" in line]
    assert len(notes) == 1 and "[bench]" in notes[0]
    assert cli.main(["report", "--out", str(out), "--md", str(md)]) == 0
    assert "plots skipped" in capsys.readouterr().err


def test_result_and_poison_hooks(fake_bench):
    """``Bound.result`` maps the call's return to the checked tensor and stays out of the timing; ``Bound.poison``
    runs between the warm and the checked call, so a call that leaves part of memory it allocated itself unwritten
    (here: a reused buffer holding the warm call's correct numbers) fails instead of passing on stale values."""
    events: dict[str, list] = {}

    def peer(name: str, half: bool, poison: bool):
        def bind(case, inp):
            pool, ev = torch.empty(64, 32), events.setdefault(name, [])

            def fn():
                ev.append("call")
                rows = 32 if half and ev.count("call") > 1 else 64  # after the warm call: writes only half
                pool[:rows] = (inp["a"].float() @ inp["b"].float())[:rows]
                return (pool, "not an lse")

            return Bound(fn, result=lambda res: ev.append("result") or res[0],
                         poison=(lambda: ev.append("poison") or pool.fill_(float("nan"))) if poison else None)

        return Peer(name, bind)

    peers = [peer("whole", False, True), peer("half", True, True), peer("half-unpoisoned", True, False)]
    rows = {r["impl"]: r for r in runner.run_case(Suite("gemm", [FakeCase()], peers, _inputs, _ref), FakeCase())}
    assert rows["whole"]["error"] is None and rows["whole"]["tflops"] is not None
    assert "NaN" in rows["half"]["error"] and rows["half"]["tflops"] is None
    assert rows["half-unpoisoned"]["error"] is None  # what the poison is for: stale correct values pass
    assert events["whole"][:4] == ["call", "poison", "call", "result"]
    assert events["whole"].count("result") == 1  # the checked call only; none while timing
    assert "poison" not in events["half-unpoisoned"]
