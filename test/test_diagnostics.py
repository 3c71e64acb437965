"""torch_autows.diagnostics: one counter + log-once facility behind runtime.fallback and inductor.support.

The names callers use (``fallback.counters`` / ``_logged``, ``support.site_counters`` / ``_logged``) must stay
the very objects the facility counts in and clears, and each (op, reason) must log exactly once with the
message text the package has always written.
"""
from __future__ import annotations

import logging

import pytest

from torch_autows import diagnostics
from torch_autows.inductor import support
from torch_autows.runtime import fallback


@pytest.fixture(autouse=True)
def _clean():
    diagnostics.reset()
    yield
    diagnostics.reset()


def test_aliases_are_the_facility_objects_and_survive_reset():
    assert fallback.counters is diagnostics.calls.counters and fallback._logged is diagnostics.calls.logged
    assert support.site_counters is diagnostics.sites.counters and support._logged is diagnostics.sites.logged
    fallback.note_fallback("gemm", "r")
    support.note_site("gemm", "r")
    fallback.reset()
    support.reset()
    assert fallback.counters is diagnostics.calls.counters and not fallback.counters and not fallback._logged
    assert support.site_counters is diagnostics.sites.counters and not support.site_counters
    assert not support._logged


def test_fallback_counts_every_call_and_logs_each_reason_once(caplog):
    caplog.set_level(logging.WARNING, logger="torch_autows")
    for _ in range(3):
        fallback.note_fallback("gemm", "dtype torch.int8")
    fallback.note_fallback("gemm", "another")
    fallback.note_fallback("bmm", "another")
    fallback.note_served("gemm")
    fallback.note_vendor("gemm")
    assert dict(fallback.counters) == {"gemm.fallback": 4, "bmm.fallback": 1, "gemm.autows": 1, "gemm.vendor": 1}
    assert [r.getMessage() for r in caplog.records] == [
        "autows gemm: falling back to torch: dtype torch.int8",
        "autows gemm: falling back to torch: another",
        "autows bmm: falling back to torch: another"]
    assert all(r.name == "torch_autows" and r.levelno == logging.WARNING for r in caplog.records)
    assert fallback._logged == {("gemm", "dtype torch.int8"), ("gemm", "another"), ("bmm", "another")}


def test_sites_and_calls_are_separate(caplog):
    caplog.set_level(logging.WARNING, logger="torch_autows")
    support.note_site("attention", "head_dim 96")
    support.note_site("attention", "head_dim 96")
    fallback.note_fallback("attention", "head_dim 96")  # the same reason at run time is logged again
    assert dict(support.site_counters) == {"attention.left": 2}
    assert dict(fallback.counters) == {"attention.fallback": 1}
    assert [r.getMessage() for r in caplog.records] == [
        "autows attention: left to Inductor's default path: head_dim 96",
        "autows attention: falling back to torch: head_dim 96"]


def test_log_once_from_many_threads_logs_once(caplog):
    import threading

    caplog.set_level(logging.WARNING, logger="torch_autows")
    d = diagnostics.Diagnostics()
    barrier = threading.Barrier(8)

    def go():
        barrier.wait()
        d.log_once(("op", "why"), "once: %s", "why")

    threads = [threading.Thread(target=go) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r.getMessage() for r in caplog.records] == ["once: why"]
