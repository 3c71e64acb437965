"""The op kinds the attention backward adds (passes/BACKWARD.md §2): ``atomic_add_ptr``, ``smem_store`` and the
transposed-frame / query-bounded ``mask``, in both interpreters, and the ``global-race`` check on output writes."""
from __future__ import annotations

import random

import pytest
import torch

from torch_autows.codegen.emitters import EMITTERS, mask_guard
from torch_autows.interp import Violation, run_partitioned, run_sequential
from torch_autows.interp.ops import apply
from torch_autows.ir import Arg, Buffer, Grid, Options, Partition, Program, TileType, Value, op

T = TileType


def _program(body, tiles=2, buffers=()):
    """A hand-written Program of ``tiles`` CTAs (one tile each) writing output ``y`` [8, 8] f32, with the same body
    as its one partition (so both interpreters run it)."""
    args = (Arg("y", "ptr", "f32", ("N", "D"), out=True),)
    grid = Grid((("pid", str(tiles)),), persistent=False)
    return Program("t", args, grid, Options(block_m=64, block_n=64, data_partition=1), tuple(body),
                   partitions=(Partition("c0", 4, 240, tuple(body)),), buffers=tuple(buffers))


def _write(kind, row):
    return [op("full", [Value("x", T("f32", (4, 8)))], value=1.0),
            op(kind, [], ["x"], arg="y", row=row, col=0, ld=8, rows_valid=4)]


def _both(program):
    """The outputs of the sequential and the partitioned run, or the violation kinds they raised."""
    out = []
    for run in (lambda i: run_sequential(program, i), lambda i: run_partitioned(program, i, policy="random")):
        try:
            out.append(run({"y": torch.zeros(8, 8)})["y"])
        except Violation as v:
            out.append(v.kind)
    return out


def test_two_ctas_plain_storing_one_row_is_a_global_race():
    assert _both(_program(_write("store_ptr", "0"))) == ["global-race", "global-race"]


def test_ctas_storing_their_own_rows_do_not_race():
    for y in _both(_program(_write("store_ptr", "pid*4"))):
        assert torch.equal(y, torch.ones(8, 8))


def test_atomic_adds_may_overlap_and_sum():
    for y in _both(_program(_write("atomic_add_ptr", "0"), tiles=3)):
        assert torch.equal(y[:4], torch.full((4, 8), 3.0)) and torch.equal(y[4:], torch.zeros(4, 8))


def test_a_plain_store_over_another_ctas_atomic_add_races():
    body = [*_write("atomic_add_ptr", "0"),
            op("store_ptr", [], ["x"], arg="y", row="(1-pid)*2", col=0, ld=8, rows_valid=1)]
    assert _both(_program(body)) == ["global-race", "global-race"]


def test_atomic_add_takes_f32_only():
    body = [op("full", [Value("x", T("bf16", (4, 8)))], value=1.0),
            op("atomic_add_ptr", [], ["x"], arg="y", row="0", col=0, ld=8, rows_valid=4)]
    with pytest.raises(Exception, match="f32"):
        run_sequential(_program(body, tiles=1), {"y": torch.zeros(8, 8)})


def _smem_loop(wait: bool):
    """Two steps, each storing a register tile to the same SMEM slot and issuing an mma reading it; with
    ``wait=False`` the first step's wgmma is still in flight at the second store."""
    s, r = T("bf16", (64, 64), "smem"), T("f32", (64, 64))
    loop = (op("smem_store", [Value("s", s)], ["x"]),
            op("mma", [Value("acc2", r)], ["x", "s", "acc"], wait=wait, pending=0),
            op("yield", [], ["acc2"]))
    body = [op("full", [Value("x", T("bf16", (64, 64)))], value=0.5),
            op("zeros", [Value("acc0", r)]),
            op("loop", [Value("acc_f", r)], ["acc0"], loop, var="j", lb=0, ub=2, iter_args=("acc",)),
            op("mma_wait", [Value("acc_w", r)], ["acc_f"], pending=0)]
    return _program(body, tiles=1, buffers=(Buffer("s_buf", s, "s", count=1, offset=0),))


def test_smem_store_over_a_slot_an_unretired_wgmma_reads_is_an_overwrite():
    with pytest.raises(Violation) as e:
        run_partitioned(_smem_loop(wait=False), {"y": torch.zeros(8, 8)})
    assert e.value.kind == "overwrite" and "smem_store" in e.value.message


def test_smem_store_after_the_wgmma_retired_is_fine():
    run_partitioned(_smem_loop(wait=True), {"y": torch.zeros(8, 8)})


# ------------------------------------------------------------------------------------------ the mask


class _Ctx:
    """What the mask's semantics and emitter read: index expressions over ``scalars``, a layout per value."""

    def __init__(self, scalars, skip_mask=False):
        self.scalars, self.layouts = scalars, {"m": "L"}
        self.program = type("P", (), {"options": Options(skip_mask=skip_mask)})()

    def eval(self, e):
        return eval(str(e), {"min": min, "max": max}, dict(self.scalars))

    def _slice(self, axis, parent):
        return f"{parent}_S{axis}"


class _GL:
    """The few Gluon names the mask's emitted lines use, over torch."""

    @staticmethod
    def arange(lo, hi, layout=None):
        return torch.arange(lo, hi)

    @staticmethod
    def where(c, a, b):
        return torch.where(c, a, torch.as_tensor(b, dtype=a.dtype))

    @staticmethod
    def minimum(a, b):
        return torch.clamp(a, max=b)


def _mask_op(**attrs):
    return op("mask", [Value("m", T("f32", (16, 8)))], ["x"], **attrs)


def _emitted(o, scalars, x):
    lines = EMITTERS["mask"](_Ctx(scalars), o, 0)
    env = {"gl": _GL, "v_x": x, "L_S0": None, "L_S1": None, **scalars}
    exec("\n".join(lines), env)
    return env["v_m"]


CASES = [(row, col, kv, q, causal) for row, col, kv, q, causal in
         ((0, 0, 16, 8, False), (8, 0, 12, 5, True), (0, 8, 9, 14, True), (16, 0, 40, 3, True), (0, 16, 3, 40, False),
          (24, 16, 30, 20, True), (4, 4, 100, 100, True))]


@pytest.mark.parametrize("row,col,kv,q,causal", CASES)
def test_keys_on_rows_is_the_transposed_mask(row, col, kv, q, causal):
    x = torch.randn(16, 8)
    sc = {"R": row, "C": col, "Skv": kv, "Sq": q}
    ctx = _Ctx(sc)
    t = apply(ctx, _mask_op(row="R", col="C", kv_len="Skv", q_len="Sq", causal=causal, keys_on_rows=True), [x])[0]
    ref = apply(ctx, op("mask", [Value("m", T("f32", (8, 16)))], ["x"], row="C", col="R", kv_len="Skv", q_len="Sq",
                        causal=causal), [x.t()])[0].t()
    assert torch.equal(t, ref)
    keys, queries = (row + torch.arange(16))[:, None], (col + torch.arange(8))[None, :]
    keep = (keys < kv) & (queries < q) & ((keys <= queries) if causal else True)
    assert torch.equal(t, torch.where(keep, x, torch.full_like(x, float("-inf"))))


@pytest.mark.parametrize("frame", [{"keys_on_rows": True}, {"q_len": "Sq"}, {"keys_on_rows": True, "q_len": "Sq"}, {}])
@pytest.mark.parametrize("row,col,kv,q,causal", CASES)
def test_mask_emitter_agrees_with_the_interpreter(frame, row, col, kv, q, causal):
    x = torch.randn(16, 8)
    sc = {"R": row, "C": col, "Skv": kv, "Sq": q}
    o = _mask_op(row="R", col="C", kv_len="Skv", causal=causal, **frame)
    assert torch.equal(_emitted(o, sc, x), apply(_Ctx(sc), o, [x])[0])


def test_mask_guard_is_true_wherever_the_mask_changes_a_score():
    rng = random.Random(0)
    for _ in range(400):
        kv, q = rng.randrange(1, 80), rng.randrange(1, 80)
        row, col = 8 * rng.randrange(0, 10), 8 * rng.randrange(0, 10)
        for frame in ({"keys_on_rows": True, "q_len": "Sq"}, {"q_len": "Sq"}, {"keys_on_rows": True}):
            o = _mask_op(row="R", col="C", kv_len="Skv", causal=rng.random() < 0.5, **frame)
            sc = {"R": row, "C": col, "Skv": kv, "Sq": q}
            changes = bool(apply(_Ctx(sc), o, [torch.zeros(16, 8)])[0].isinf().any())
            if changes:
                assert eval(mask_guard(o, 16, 8), {}, sc), (frame, sc, o)
