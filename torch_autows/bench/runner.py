"""The measuring loop shared by all subcommands: check every peer's output, then time the peers that passed.

Per case: fresh inputs, an fp32 reference (or, where the suite gives none, the first peer that runs),
then for each peer: bind -> warm call (compilation; the autows counter must move) -> poison the output
with NaN -> checked call -> NaN/Inf and relative-error check. Peers that passed are timed with
``triton.testing.do_bench(..., return_mode="median")``, interleaved over ``repeat`` rounds so drift hits
all peers alike. Any exception becomes the row's error and the run goes on.
"""
from __future__ import annotations

import contextlib
import gc
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .results import error_text, make_row

TOL = {"bf16": 1e-2, "fp16": 1e-2}


class Skip(Exception):
    """The peer does not apply to this case (e.g. the Gluon reference on bmm): no row is written."""


class CheckFailed(Exception):
    """The peer ran but its result is not acceptable (NaN, over tolerance, fell back to torch)."""


@dataclass
class Bound:
    """A peer bound to one case's inputs."""

    fn: Callable[[], Any]  # the timed call; returns the output, or a tuple (out, lse)
    out: Any = None  # a preallocated output ``fn`` writes into: poisoned with NaN before the checked call
    counters: tuple[str, ...] = ()  # ops of which one "<op>.autows" counter must increase on the warm call
    context: Callable[[], Any] = contextlib.nullcontext  # entered around every call (e.g. sdpa_kernel)
    inspect: Callable[[], str | None] | None = None  # a note after the warm call (e.g. WS missing)
    note: str | None = None
    extra: Callable[[], dict] | None = None  # more row fields after timing (model: GPU time split)
    #: maps ``fn``'s return to the checked output (e.g. several gradients -> one flat tensor), outside the timing
    result: Callable[[Any], Any] | None = None
    #: called between the warm and the checked call, for outputs ``fn`` allocates itself (no ``out`` to fill)
    poison: Callable[[], None] | None = None


@dataclass(frozen=True)
class Peer:
    name: str
    bind: Callable[[Any, Any], Bound]  # (case, inputs) -> Bound; raises Skip when it does not apply
    about: str = ""


@dataclass
class Ref:
    out: Any  # fp32 reference output
    lse: Any = None
    note: str | None = None


@dataclass
class Suite:
    work: str
    cases: list
    peers: list[Peer]
    make_inputs: Callable[[Any], Any]
    reference: Callable[[Any, Any], Ref | None]  # None: the first peer that runs is the reference
    tolerance: Callable[[Any, list[dict]], float] = field(default=lambda case, rows: TOL.get(case.dtype, 1e-2))
    before_case: Callable[[], None] | None = None


def rel_err(out, ref) -> float:
    import torch

    diff = torch.linalg.vector_norm(out.float() - ref)
    return float(diff / torch.linalg.vector_norm(ref).clamp_min(1e-30))


def _split(res):
    if isinstance(res, (tuple, list)):
        return res[0], (res[1] if len(res) > 1 else None)
    return res, None


def _autows_counts(ops: tuple[str, ...]) -> dict:
    from torch_autows.runtime.fallback import counters

    return {op: counters[f"{op}.autows"] for op in ops}


def _fallback_reasons(ops: tuple[str, ...]) -> str:
    """``": <reason>; ..."`` for the fallback reasons logged so far in the process for ``ops`` ("" if none)."""
    from torch_autows.runtime.fallback import _logged

    why = sorted({str(k[1]) for k in _logged if isinstance(k, tuple) and len(k) == 2 and k[0] in ops})
    return (": " + "; ".join(why)) if why else ""


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def check(b: Bound, ref: Ref | None, tol: float) -> tuple[Any, float | None, str | None]:
    """Warm call, poisoned checked call, checks. Returns (out, rel_err, note); raises CheckFailed."""
    import torch

    before = _autows_counts(b.counters) if b.counters else None
    with b.context():
        b.fn()
    _sync()
    if before is not None and _autows_counts(b.counters) == before:
        raise CheckFailed("fell back to torch" + _fallback_reasons(b.counters))
    notes = [n for n in (b.note, b.inspect() if b.inspect else None) if n]
    if b.out is not None:
        b.out.fill_(float("nan"))
    if b.poison is not None:
        b.poison()
    with b.context():
        res = b.fn()
    out, lse = _split(b.result(res) if b.result else res)
    _sync()
    if not bool(torch.isfinite(out).all()):
        raise CheckFailed("output has NaN/Inf (poisoned output not fully written?)")
    if ref is None:
        return out, None, "; ".join(notes) or None
    err = rel_err(out, ref.out)
    if not err <= tol:
        raise CheckFailed(f"rel_err {err:.3e} > tolerance {tol:.0e}", err)
    if lse is not None and ref.lse is not None:
        lerr = rel_err(lse, ref.lse)
        if not lerr <= tol:
            raise CheckFailed(f"lse rel_err {lerr:.3e} > tolerance {tol:.0e}", err)
    return out, err, "; ".join(notes) or None


def progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _free() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run_case(suite: Suite, case, repeat: int = 1, warmup: int = 25, rep: int = 100) -> list[dict]:
    from triton.testing import do_bench

    rows: list[dict] = []
    row = lambda impl, **kw: make_row(suite.work, case.name, impl, **kw)
    if suite.before_case:
        suite.before_case()
    try:
        inputs = suite.make_inputs(case)
        ref = suite.reference(case, inputs)
    except Exception as e:  # e.g. out of memory: every peer of the case fails with the reason
        msg = "inputs/reference: " + error_text(e)
        _free()
        return [row(p.name, error=msg) for p in suite.peers]
    passed: list[tuple[Peer, Bound, dict]] = []
    for peer in suite.peers:
        try:
            b = peer.bind(case, inputs)
        except Skip:
            continue
        except Exception as e:
            rows.append(row(peer.name, error=error_text(e)))
            continue
        try:
            out, err, note = check(b, ref, suite.tolerance(case, rows))
        except CheckFailed as e:
            err = e.args[1] if len(e.args) > 1 else None
            rows.append(row(peer.name, error=str(e.args[0]), rel_err=err, note=b.note))
            continue
        except Exception as e:
            rows.append(row(peer.name, error=error_text(e), note=b.note))
            _free()
            continue
        if ref is None:  # this peer's output is the reference for the rest of the case
            ref = Ref(out.float(), note=f"reference: {peer.name} output")
            err, note = 0.0, "; ".join(x for x in (note, "its output is the reference for this case") if x)
        elif ref.note:
            note = "; ".join(x for x in (note, ref.note) if x)
        del out
        fields = {"impl": peer.name, "rel_err": err, "note": note}
        passed.append((peer, b, fields))
        rows.append(fields)  # placeholder, replaced below (keeps peer order)
    samples: dict[str, list[float]] = {p.name: [] for p, _, _ in passed}
    for _ in range(repeat):
        for peer, b, fields in passed:
            if "error" in fields:
                continue
            try:
                with b.context():
                    samples[peer.name].append(do_bench(b.fn, warmup=warmup, rep=rep, return_mode="median"))
            except Exception as e:
                fields["error"] = error_text(e)
    for peer, b, fields in passed:
        i = next(k for k, r in enumerate(rows) if r is fields)
        s = samples[peer.name]
        if fields.get("error") or not s:
            rows[i] = row(peer.name, error=fields.get("error") or "not timed", rel_err=fields["rel_err"])
            continue
        ms = statistics.median(s)
        spread = (max(s) - min(s)) / ms if len(s) > 1 and ms > 0 else None
        extra = {}
        if b.extra:
            try:
                extra = b.extra()
            except Exception as e:
                extra = {"split_error": error_text(e)}
        if hasattr(case, "bytes"):  # memory-bound cases: the effective bandwidth of the traffic they must move
            extra.setdefault("tbps", case.bytes / (ms * 1e-3) / 1e12)
        rows[i] = row(peer.name, tflops=case.flops / (ms * 1e-3) / 1e12, ms=ms, rel_err=fields["rel_err"],
                      note=fields["note"], spread=spread, samples_ms=s if len(s) > 1 else None, **extra)
    del passed, inputs, ref
    _free()
    return rows


def case_summary(rows: list[dict], seconds: float) -> str:
    from .report import summarize

    parts = [f"{r['impl']} {r['tflops']:.1f}" if r.get("tflops") is not None else f"{r['impl']} FAIL"
             for r in rows]
    s = summarize(rows)
    ratio = f" | autows/best {s[0]['ratio']:.3f}" if s and s[0]["ratio"] is not None else ""
    return ", ".join(parts) + ratio + f"  ({seconds:.0f} s)"


def run_suite(suite: Suite, repeat: int = 1, warmup: int = 25, rep: int = 100,
              on_case: Callable[[list[dict]], None] | None = None) -> list[dict]:
    """Run every case; ``on_case(rows_so_far)`` after each one (the CLI rewrites its JSON there)."""
    all_rows: list[dict] = []
    for i, case in enumerate(suite.cases, 1):
        t0 = time.time()
        progress(f"[{i}/{len(suite.cases)}] {suite.work} {case.name}: running")
        rows = run_case(suite, case, repeat, warmup, rep)
        all_rows += rows
        progress(f"[{i}/{len(suite.cases)}] {suite.work} {case.name}: {case_summary(rows, time.time() - t0)}")
        if on_case:
            on_case(all_rows)
    return all_rows
