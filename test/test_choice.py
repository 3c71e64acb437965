"""runtime.choice on CPU: the decision cache (key, disk, concurrency, corruption), the priors, the measured
rule, the runtimes' use of it (the GPU faked as in test_bound_launch.py) and explain()'s report."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest
import torch

from torch_autows import config, diagnostics
from torch_autows.runtime import choice
from torch_autows.runtime.fallback import counters

CUDA = torch.device("cuda", 0)
KEY = ("mm", "torch.bfloat16", "torch.bfloat16", (False, False), False, 8, 4096, 4096)


@pytest.fixture
def measure(monkeypatch, tmp_path):
    """Measure mode with a private cache dir, a fixed environment and no CUDA capture check."""
    monkeypatch.setattr(config, "choice", "measure", raising=False)
    monkeypatch.setattr(config, "cache_dir", str(tmp_path))
    monkeypatch.setattr(choice, "environment", lambda index: ("NVIDIA H200", 132, "13.0", 580, "2.11", "3.6", "x"))
    monkeypatch.setattr(choice, "_capturing", lambda device: False)
    monkeypatch.setattr("torch_autows.runtime.device.index", lambda device: 0)
    choice.reset()
    counters.clear()
    yield tmp_path
    choice.reset()


def _timed(monkeypatch, ours_ms, vendor_ms, **more_ms):
    """The timer (``choice._time_ms``) returns fixed medians per side (one list of rounds each; ``more_ms``: further
    sides by name); counts the calls. Returns the "ours" and "vendor" runs, the calls, and a maker of runs of the
    other sides."""
    seq = {"ours": list(ours_ms), "vendor": list(vendor_ms), **more_ms}
    calls = []

    def time_ms(fn, warmup_ms, rep_ms):
        side = fn.side
        calls.append(side)
        return seq[side][sum(c == side for c in calls) - 1]

    monkeypatch.setattr(choice, "_time_ms", time_ms)

    def side(name):
        def run():
            return None
        run.side = name
        return run

    return side("ours"), side("vendor"), calls, side


def test_measured_rule_keeps_the_vendor_unless_ours_wins_every_round(measure, monkeypatch):
    # ~5% faster, one round tied: measured again (the median is ahead), and tied again there
    ours, vendor, calls, _ = _timed(monkeypatch, [0.90, 0.95, 1.00] * 2, [1.0, 1.0, 1.0] * 2)
    d = choice.decide(KEY, ours, vendor, prior=True, device=CUDA)
    assert not d.use_ours and d.source == "measured" and counters["choice.remeasured"] == 1
    assert d.spread == pytest.approx((1 / 0.90 - 1.0) / (1 / 0.95))
    # interleaved rounds, the vendor first in every other one
    assert calls == ["ours", "vendor", "vendor", "ours", "ours", "vendor"] * 2 and choice.ROUNDS == 3
    choice.reset()
    ours, vendor, _, _ = _timed(monkeypatch, [0.80, 0.81, 0.80], [1.0, 1.0, 1.01])
    key2 = (*KEY[:-1], 8192)
    d = choice.decide(key2, ours, vendor, prior=False, device=CUDA)
    assert d.use_ours and d.ours_ms == 0.80 and d.vendor_ms == 1.0
    assert "autows" in d.describe() and "1.25x" in d.describe()


def test_one_noisy_round_is_measured_again_and_the_second_verdict_stands(measure, monkeypatch):
    """Ours ahead by its median but not in one round: the rounds run once more; winning every one of them keeps
    ours. A vendor ahead by its median is not measured again."""
    ours, vendor, calls, _ = _timed(monkeypatch, [0.90, 1.00, 0.90, 0.92, 0.93, 0.92], [1.0] * 6)
    d = choice.decide(KEY, ours, vendor, prior=False, device=CUDA)
    assert d.use_ours and d.ours_ms == 0.92 and counters["choice.remeasured"] == 1 and len(calls) == 12
    choice.reset()
    counters.clear()
    ours, vendor, calls, _ = _timed(monkeypatch, [1.0, 1.1, 1.05], [1.0, 1.0, 1.0])
    d = choice.decide((*KEY[:-1], 8192), ours, vendor, prior=True, device=CUDA)
    assert not d.use_ours and counters["choice.remeasured"] == 0 and len(calls) == 6


def test_second_process_reads_the_disk_and_measures_nothing(measure, monkeypatch):
    ours, vendor, calls, _ = _timed(monkeypatch, [1.0] * 3, [2.0] * 3)
    assert choice.decide(KEY, ours, vendor, prior=False, device=CUDA).use_ours
    assert counters["choice.measured"] == 1
    choice.reset()  # a new process: nothing in memory
    calls.clear()
    d = choice.decide(KEY, ours, vendor, prior=False, device=CUDA)
    assert d.use_ours and d.source == "cache" and d.ours_ms == 1.0 and calls == []
    assert counters["choice.measured"] == 1 and counters["choice.cache"] == 1


def test_the_key_holds_the_environment_and_the_source_hash(measure, monkeypatch):
    full = choice._full_key(KEY, CUDA)
    assert "NVIDIA H200" in full and '"132"' in full and '"x"' in full
    monkeypatch.setattr(choice, "environment", lambda index: ("NVIDIA H200", 132, "13.0", 580, "2.11", "3.6", "y"))
    assert choice._path(choice._full_key(KEY, CUDA)) != choice._path(full)
    # the real hash covers the kernel-generating sources, and changes with them
    h = choice.sources_hash()
    assert len(h) == 16 and h == choice.sources_hash()


# the op table (ir/kinds.py) was left out of the hash while it was ir_ops.py beside ir.py and ir_text.py
@pytest.mark.parametrize("changed", [("templates", "gemm.py"), ("ir", "kinds.py")])
def test_sources_hash_changes_with_a_kernel_source(tmp_path, monkeypatch, changed):
    import shutil

    import torch_autows

    pkg = os.path.dirname(torch_autows.__file__)
    copy = tmp_path / "torch_autows"
    shutil.copytree(pkg, copy, ignore=shutil.ignore_patterns("__pycache__"))
    code = "from torch_autows.runtime import choice; print(choice.sources_hash())"
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    before = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=tmp_path)
    with open(copy.joinpath(*changed), "a") as f:
        f.write("\n# a change\n")
    after = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert before.returncode == 0, before.stderr
    assert before.stdout.strip() and before.stdout != after.stdout


@pytest.mark.parametrize("garbage", [b"\x00\x01garbage", b"", b'{"key": "another", "use_ours": true}',
                                     b'{"use_ours": "yes"}'])
def test_a_corrupted_entry_is_logged_once_ignored_and_measured_again(measure, monkeypatch, caplog, garbage):
    ours, vendor, calls, _ = _timed(monkeypatch, [1.0] * 6, [2.0] * 6)
    path = choice._path(choice._full_key(KEY, CUDA))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(garbage)
    diagnostics.faults.reset()
    d = choice.decide(KEY, ours, vendor, prior=False, device=CUDA)
    assert d.source == "measured" and d.use_ours
    assert sum("corrupted choice cache entry" in r.message for r in caplog.records) == 1
    with open(path) as f:
        assert json.load(f)["use_ours"] is True  # rewritten whole


def test_concurrent_writers_threads_and_processes(measure, monkeypatch):
    d = choice.Decision(True, "measured", 1.0, 2.0, 0.01)
    errors = []
    barrier = threading.Barrier(4)

    def write():
        try:
            barrier.wait()
            for _ in range(50):
                choice._write(KEY, CUDA, d)
                assert choice._read(KEY, CUDA) is not None
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=write) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    script = f"""
import torch
from torch_autows import config
from torch_autows.runtime import choice
config.cache_dir = {str(measure)!r}
choice.environment = lambda index: ("NVIDIA H200", 132, "13.0", 580, "2.11", "3.6", "x")
import torch_autows.runtime.device as dev
dev.index = lambda device: 0
d = choice.Decision(False, "measured", 2.0, 1.0, 0.0)
for _ in range(100):
    choice._write({KEY!r}, torch.device("cuda", 0), d)
    r = choice._read({KEY!r}, torch.device("cuda", 0))
    assert r is not None, "a torn entry"
print("ok")
"""
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0 and out.strip() == "ok", err
    leftovers = [f for _, _, fs in os.walk(measure) for f in fs if not f.endswith(".json")]
    assert leftovers == []


def test_capture_answers_with_the_prior_and_records_nothing(measure, monkeypatch):
    monkeypatch.setattr(choice, "_capturing", lambda device: True)
    ours, vendor, calls, _ = _timed(monkeypatch, [1.0] * 3, [2.0] * 3)
    d = choice.decide(KEY, ours, vendor, prior=False, device=CUDA)
    assert d == choice.Decision(False, "prior") and calls == [] and choice.records == {}


def test_forced_modes_and_no_vendor(measure, monkeypatch):
    ours, vendor, calls, _ = _timed(monkeypatch, [1.0] * 3, [2.0] * 3)
    monkeypatch.setattr(config, "choice", "vendor")
    assert not choice.decide(KEY, ours, vendor, prior=True, device=CUDA).use_ours
    assert choice.decide(KEY, ours, None, prior=False, device=CUDA).use_ours  # nothing to compare with
    monkeypatch.setattr(config, "choice", "autows")
    assert choice.decide(KEY, ours, vendor, prior=False, device=CUDA).use_ours
    assert calls == [] and choice.records == {}
    monkeypatch.setattr(config, "choice", "bogus")
    with pytest.raises(ValueError, match="measure"):
        choice.decide(KEY, ours, vendor, prior=False, device=CUDA)


def test_used_since_lists_the_decisions_a_compile_asked_for(measure, monkeypatch):
    """The bench's note on a compiled peer: the sites decided after a mark, measured or already known, in the order
    asked; forced decisions are not recorded, so not listed."""
    ours, vendor, _, _ = _timed(monkeypatch, [0.5] * 3, [1.0] * 3)
    choice.decide(KEY, ours, vendor, prior=False, device=CUDA)
    since = choice.mark()
    assert choice.used_since(since) is None
    key2 = ("swiglu", "torch.bfloat16", "torch.bfloat16", (False, True), 16384, 14336, 4096, "save")
    ours2, vendor2, _, _ = _timed(monkeypatch, [1.0] * 3, [0.9] * 3)
    choice.decide(key2, ours2, vendor2, prior=False, device=CUDA)
    choice.decide(KEY, ours, vendor, prior=False, device=CUDA)  # known: asked again, listed, not measured
    monkeypatch.setattr(config, "choice", "vendor")
    choice.decide(("mm", 1, 2), ours, vendor, prior=False, device=CUDA)
    note = choice.used_since(since)
    assert note == ("swiglu 16384x14336x4096 save: vendor (measured: autows 1000.0 us, vendor 900.0 us, 0.90x, "
                    "spread 0.0%); mm 8x4096x4096: autows (measured: autows 500.0 us, vendor 1000.0 us, 2.00x, "
                    "spread 0.0%)"), note


@pytest.mark.parametrize("m,n,k,ours", [(1, 4096, 4096, False), (256, 14336, 4096, False), (512, 4096, 4096, False),
                                        (4096, 4096, 4096, True), (8192, 1024, 4096, True), (16384, 1024, 4096, True),
                                        (8192, 128, 4096, False)])
def test_gemm_prior(m, n, k, ours):
    assert choice.gemm_prior(m, n, k) is ours


@pytest.mark.parametrize("d,causal,skv,ours", [(128, False, 512, False), (128, True, 512, False),
                                               (128, False, 4096, False), (128, True, 4096, True),
                                               (128, True, 2048, True), (64, True, 4096, False),
                                               (64, False, 8192, True), (128, False, 16384, True),
                                               (96, False, 16384, True), (96, True, 1024, True),
                                               (96, False, 512, False), (192, True, 16384, False),
                                               (256, False, 16384, False)])
def test_attention_prior(d, causal, skv, ours):
    assert choice.attention_prior(d, causal, skv) is ours


def test_bucket():
    assert [choice.bucket(n) for n in (0, 1, 2, 3, 8, 9, 1000, 1024)] == [1, 1, 2, 4, 8, 16, 1024, 1024]


def test_materialize_keeps_sizes_strides_dtype():
    t = torch.empty(8, 4, dtype=torch.bfloat16).t()[:, ::2]
    r = choice.materialize(t)
    assert r.shape == t.shape and r.stride() == t.stride() and r.dtype == t.dtype and torch.isfinite(r).all()
    assert choice.materialize(torch.empty(0, 3)).shape == (0, 3)


def test_compile_time_choice_measures_on_real_tensors_under_a_fake_mode(monkeypatch):
    """Inductor's passes may run under a FakeTensorMode: the measurement must still see real tensors."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    from torch_autows.inductor import support as target

    monkeypatch.setattr(config, "choice", "measure", raising=False)
    monkeypatch.setattr(target, "_capability", lambda index: (9, 0))
    a = target.fake_tensor((64, 64), (64, 1), torch.bfloat16, CUDA)
    seen = []

    def decide():
        seen.append(isinstance(torch.randn(2), FakeTensor))
        return choice.Decision(False, "measured", 2.0, 1.0, 0.0)

    with FakeTensorMode():
        sc = target._site_choice(decide, lambda: True, a)
    assert seen == [False] and not sc.use_ours and "measured" in sc.vendor_reason


def test_candidate_configs_are_timed_in_every_round_and_the_fastest_kept(measure, monkeypatch):
    """A dict of our candidate configs: each is timed in each interleaved round beside the vendor; the one of least
    median is ours, compared with the vendor by the every-round rule, and its name is recorded and read back."""
    _, vendor, calls, side = _timed(monkeypatch, [], [0.9, 0.9, 0.9], dec_a=[1.0, 1.1, 1.0], decs_b=[0.7, 0.71, 0.69])
    d = choice.decide(KEY, {"dec_a": side("dec_a"), "decs_b": side("decs_b")}, vendor, prior=False, device=CUDA)
    assert calls == ["dec_a", "decs_b", "vendor", "vendor", "decs_b", "dec_a", "dec_a", "decs_b", "vendor"]
    assert d.use_ours and d.config == "decs_b" and d.ours_ms == 0.70 and "autows decs_b" in d.describe()
    choice.reset()  # a new process reads the config from the disk
    assert choice.decide(KEY, {}, vendor, prior=False, device=CUDA).config == "decs_b"


def test_gemm_runs_the_config_the_measurement_kept_where_the_call_allows_it(monkeypatch):
    from torch_autows.runtime import gemm as rtg

    seen = []
    monkeypatch.setattr(rtg, "support_reason", lambda *a: None)
    monkeypatch.setattr(rtg, "_launch", lambda req, cfg, *a: seen.append(cfg))
    monkeypatch.setattr(rtg, "_decide", lambda *a: choice.Decision(True, "measured", 1.0, 2.0, 0.0,
                                                                   "decs_64x128_m16_s1"))
    rtg._BOUND.clear()
    x, w = torch.randn(4, 64).bfloat16(), torch.randn(96, 64).bfloat16()
    rtg.gemm(x, w.t(), None, torch.bfloat16)  # nn.Linear's layout: the swap-AB config serves it
    rtg.gemm(x, w.t().contiguous(), None, torch.bfloat16)  # a row-major b: the heuristic's config
    monkeypatch.setattr(rtg, "_decide", lambda *a: choice.Decision(True, "forced"))  # nothing measured
    rtg.gemm(x, w.t(), None, torch.bfloat16, out=torch.empty(4, 96).bfloat16())  # the heuristic's swap pick
    rtg.gemm(x, w.t(), None, torch.bfloat16, residual=torch.randn(4, 96).bfloat16())  # a residual: not swap-AB
    rtg._BOUND.clear()
    assert seen == ["decs_64x128_m16_s1", rtg.choose_config(4, 96, 64), rtg.SWAP_PICK, rtg.choose_config(4, 96, 64)]
    assert rtg.SWAP_PICK == "decs_64x128_m16_s1" and not rtg.choose_config(4, 96, 64).startswith("decs")


def test_decode_candidates():
    from torch_autows.runtime import gemm_configs as gc

    assert gc.decode_candidates(8, 4096, 4096, swap=True) == ["decs_64x128_m16_s1", gc.choose_config(8, 4096, 4096),
                                                               "decs_128x128_m16_s1", "decs_64x256_m16_s1",
                                                               "decs_128x256_m16_s1"]
    assert gc.decode_candidates(64, 4096, 4096, swap=True) == [gc.choose_config(64, 4096, 4096), "decs_64x128_m64_s1",
                                                               "decs_128x128_m64_s1"]
    assert gc.decode_candidates(8, 4096, 4096, swap=False) == [gc.choose_config(8, 4096, 4096)]
    assert gc.decode_candidates(128, 4096, 4096, swap=True) == [gc.choose_config(128, 4096, 4096)]
    assert all(c in gc.CONFIGS for m in (1, 32, 64) for c in gc.decode_candidates(m, 6144, 4096, swap=True))


def test_the_sides_run_in_turn_before_the_timed_rounds(measure, monkeypatch):
    """The GPU is brought to its working clocks first: every side runs in turn for SETTLE_MS before the rounds (a first
    round at idle clocks charged the side timed first ~10%, H200)."""
    ours, vendor, calls, _ = _timed(monkeypatch, [0.8] * 3, [1.0] * 3)
    settled = []
    monkeypatch.setattr(choice, "_settle", lambda runs, ms: settled.append(([r.side for r in runs], ms)))
    choice.decide(KEY, ours, vendor, prior=False, device=CUDA)
    assert settled == [(["ours", "vendor"], choice.SETTLE_MS)] and choice.SETTLE_MS >= 100
