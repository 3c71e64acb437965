"""passes/split_k (run by data_partition): the K loop of a GEMM split across CTAs, with a deterministic reduction.

IR before/after; what it refuses (a loop that is not a sum, chains, batched grids); the verifier and the
interpreter on correct and mutated reductions; the generated Gluon's reduction; the runtime's decode choice."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from torch_autows.codegen import gluon
from torch_autows.interp import POLICIES, Violation, make_instance, run_partitioned, run_sequential
from torch_autows.ir import Options, format_program, map_ops
from torch_autows.passes import PassError, data_partition, pipeline, split_k
from torch_autows.runtime import gemm as rt
from torch_autows.runtime import gemm_configs
from torch_autows.templates.attention import AttentionRequest
from torch_autows.templates.attention import build as build_attention
from torch_autows.templates.gemm import GemmRequest, build
from torch_autows.verify import VerifyError, check

OPTS = Options(block_m=64, block_n=32, block_k=32, stages=3, data_partition=1, persistent=True, split_k=3)


def _body(program) -> list[str]:
    return [ln.strip() for ln in format_program(program).splitlines()]


def test_ir_before_and_after():
    before = build(GemmRequest(1, 1, 1, bias=True), OPTS)
    after = data_partition.run(before, OPTS)
    assert "split_reduce" not in format_program(before)
    lines = _body(after)
    assert after.name == before.name + "_sk3"
    assert "arg ws: ptr<f32>[S*tiles*BM*BN]" in lines and "arg locks: ptr<i32>[tiles]" in lines
    assert "grid (pid_k: 3, pid_m: cdiv(M,64), pid_n: cdiv(N,32)) persistent=True group=8" in lines
    loop = next(ln for ln in lines if "= loop(" in ln)
    assert "lb='pid_k*cdiv(cdiv(K,32),3)'" in loop and "ub='min(cdiv(K,32),(pid_k+1)*cdiv(cdiv(K,32),3))'" in loop
    red = lines.index("%acc_out_sum:f32[64,32] = split_reduce(%acc_out) {index='(pid_m)*(cdiv(N,32))+pid_n', "
                      "locks='locks', part='pid_k', rows_valid='M-(pid_m*64)', splits=3, ws='ws'} [chain=0]")
    # the epilogue (bias, cast, store) reads the sum, after the reduction; only the summing CTA stores
    assert lines.index("%acc_bias:f32[64,32] = add(%acc_out_sum, %bias_row) [chain=0]") > red
    assert "store(%out) {arg='c', coords=('pid_m*64', 'pid_n*32'), pred='acc_out_sum'} [chain=0]" in lines
    # split_k=1 leaves the Program as it was (and prints no split_k option)
    one = replace(OPTS, split_k=1)
    assert format_program(data_partition.run(build(GemmRequest(1, 1, 1), one), one)).count("split") == 0


def test_refuses_what_does_not_add_up():
    attn = build_attention(AttentionRequest(64, "bf16", False), replace(OPTS, block_m=128, block_n=64))
    with pytest.raises(PassError, match="not a sum of mma steps"):
        split_k.run(attn, OPTS)
    with pytest.raises(PassError, match="chains would share one reduction counter"):
        two = replace(OPTS, data_partition=2)
        data_partition.run(build(GemmRequest(1, 1, 1), two), two)
    with pytest.raises(PassError, match="2-D grids"):
        split_k.run(build(GemmRequest(1, 1, 1, batch=4), OPTS), OPTS)


@pytest.mark.parametrize("variant", [{}, {"trans_b": True, "bias": True}, {"trans_a": True, "out_dtype": "f32"},
                                     {"bias": True, "residual": True}])  # the residual: added once, to the sum
@pytest.mark.parametrize("splits,persistent", [(2, True), (3, False), (4, True)])
def test_interpreter_matches_torch_and_resets_counters(variant, splits, persistent):
    _interpreted(GemmRequest(1, 1, 1, **variant), replace(OPTS, split_k=splits, persistent=persistent))


def _interpreted(request, opts, check=lambda inst, ins: None):
    """The split program sequentially and partitioned under every policy (4 seeds, 2-4 CTAs) equals torch, and
    every counter is back to zero after each run; ``check(instance, inputs)`` after each partitioned run."""
    before = build(request, opts)
    after = pipeline.run(before, opts, verify=True)
    for seed in range(4):
        inst = make_instance(after, seed)
        ins = inst.inputs()
        assert torch.equal(run_sequential(data_partition.run(before, opts), ins)["c"], inst.reference["c"])
        assert int(ins["locks"].count_nonzero()) == 0
        for policy in POLICIES:
            ins = inst.inputs()
            out = run_partitioned(after, ins, policy=policy, seed=seed, nprog=2 + seed % 3)
            assert torch.equal(out["c"], inst.reference["c"]), (policy, seed, inst.desc)
            assert int(ins["locks"].count_nonzero()) == 0  # the last arrivals reset every counter
            check(inst, ins)


def _mutate(program, fn):
    """``fn`` applied to every op of the Program and of its partitions' bodies."""
    parts = tuple(replace(p, body=map_ops(p.body, fn)) for p in program.partitions)
    return replace(program, body=map_ops(program.body, fn), partitions=parts)


def test_a_wrong_part_count_is_caught():
    after = pipeline.run(build(GemmRequest(1, 1, 1), OPTS), OPTS)
    bad = _mutate(after, lambda o: o.with_attrs(splits=2) if o.kind == "split_reduce" else o)
    with pytest.raises(VerifyError, match="sums 2 parts but grid index 'pid_k' has extent '3'"):
        check(bad, "code_partition")
    inst = make_instance(bad, 0)
    with pytest.raises(Violation) as e:  # the last arriver is declared after 2 of 3 parts
        run_partitioned(bad, inst.inputs(), policy="round_robin", seed=0)
    assert e.value.kind == "split-order"


def test_an_unguarded_store_is_refused():
    after = pipeline.run(build(GemmRequest(1, 1, 1), OPTS), OPTS)
    bad = _mutate(after, lambda o: replace(o, attrs=tuple(kv for kv in o.attrs if kv[0] != "pred")))
    with pytest.raises(VerifyError, match="without its pred: every CTA of the split would store"):
        check(bad, "code_partition")
    with pytest.raises(VerifyError, match="predicated on %nothing"):
        check(_mutate(after, lambda o: o.with_attrs(pred="nothing") if o.kind == "store" else o), "code_partition")


def test_generated_reduction():
    src = gluon.generate(pipeline.run(build(GemmRequest(1, 1, 1), OPTS), OPTS))
    order = ["pid_k = t // (num_pid_m * num_pid_n)",
             "for k in range(pid_k * gl.cdiv(gl.cdiv(K, 32), 3), min(gl.cdiv(K, 32), (pid_k + 1) * gl.cdiv(gl.cdiv(K, "
             "32), 3))):",
             "= split_reduce(", "gl.store(v_acc_out_sum_ws + (pid_k) * 2048 + v_acc_out_sum_off",
             "gl.thread_barrier()", "gl.atomic_add(locks_ptr + v_acc_out_sum_tile, 1, sem=\"acq_rel\", scope=\"gpu\")",
             "v_acc_out_sum_last = v_acc_out_sum_seen == 2", "if v_acc_out_sum_last:", "for j in range(3):",
             "gl.atomic_xchg(locks_ptr + v_acc_out_sum_tile, 0", "if v_acc_out_sum_last:",
             "tma.async_copy_shared_to_global(c_desc"]
    pos = 0
    for s in order:
        pos = src.index(s, pos) + len(s)


def test_runtime_picks_decode_tiles_for_few_rows_and_never_splits_bmm():
    assert rt.choose_config(1, 4096, 4096).startswith("dec_") and rt.choose_config(128, 4096, 4096).startswith("dec_")
    assert not rt.choose_config(129, 4096, 4096).startswith("dec_")
    # few output tiles: split K so every SM streams; many: no split (its partials cost traffic)
    assert rt.CONFIGS[rt.choose_config(1, 4096, 14336 // 4)].split_k > 1
    assert rt.CONFIGS[rt.choose_config(1, 57344, 8192)].split_k == 1
    assert all(rt.CONFIGS[rt.choose_config(m, n, 8192, split=False)].split_k == 1 for m in (1, 64) for n in (256, 4096))
    assert rt.CONFIGS[rt.choose_config(64, 4096, 192, split=False)].block_k == 64  # a batch's K in whole steps
    # the model: a wave of units is never faster than its bytes at HBM bandwidth
    t = rt.decode_time(1, 4096, 4096, 128, 128, 2)
    assert t >= 4096 * 4096 * 2 / gemm_configs._HBM_BPS


SWIGLU = GemmRequest(1, 1, 1, epilogue="swiglu")  # a loop carrying two accumulators (gate and up)


def test_two_accumulators_share_one_reduction():
    after = data_partition.run(build(SWIGLU, OPTS), OPTS)
    lines = _body(after)
    assert "arg ws: ptr<f32>[2*S*tiles*BM*BN]" in lines  # a slot per accumulator and part of every tile
    reds = [ln for ln in lines if "split_reduce(" in ln]
    assert reds == ["%acc_out_sum:f32[64,32], %acc_u_out_sum:f32[64,32] = split_reduce(%acc_out, %acc_u_out) "
                    "{index='(pid_m)*(cdiv(N,32))+pid_n', locks='locks', part='pid_k', rows_valid='M-(pid_m*64)', "
                    "splits=3, ws='ws'} [chain=0]"]
    assert "%gate:f32[64,32] = silu(%acc_out_sum) [chain=0]" in lines
    assert "%act:f32[64,32] = mul(%gate, %acc_u_out_sum) [chain=0]" in lines
    assert "store(%out) {arg='c', coords=('pid_m*64', 'pid_n*32'), pred='acc_out_sum'} [chain=0]" in lines


@pytest.mark.parametrize("variant", [{}, {"trans_a": True, "trans_b": True, "out_dtype": "f32"}])
@pytest.mark.parametrize("splits,persistent", [(2, True), (3, False), (4, True)])
def test_two_accumulators_interpreted_under_every_policy(variant, splits, persistent):
    # one arrival per CTA for both accumulators: a counter per accumulator arrival would declare a CTA the last
    # of S parts after S/2 CTAs (split-order), or sum the up projection's parts before they are written
    def check(inst, ins):
        assert inst.tensors["ws"].numel() == 2 * splits * 64 * 32 * int(inst.tensors["locks"].numel())
        assert bool(ins["ws"].isnan().all())  # every summed slot poisoned again: each was read once

    _interpreted(GemmRequest(1, 1, 1, epilogue="swiglu", **variant),
                 replace(OPTS, split_k=splits, persistent=persistent), check)


def test_an_unguarded_store_of_the_second_sum_is_refused():
    after = pipeline.run(build(SWIGLU, OPTS), OPTS)
    bad = _mutate(after, lambda o: replace(o, attrs=tuple(kv for kv in o.attrs if kv[0] != "pred")))
    with pytest.raises(VerifyError, match="without its pred"):
        check(bad, "code_partition")
    # a store predicated on the second sum's name: only the first result carries the summing CTA's flag
    bad = _mutate(after, lambda o: o.with_attrs(pred="acc_u_out_sum") if o.kind == "store" else o)
    with pytest.raises(VerifyError, match="not a split_reduce result before it"):
        check(bad, "code_partition")


def test_generated_reduction_of_two_accumulators():
    src = gluon.generate(pipeline.run(build(SWIGLU, OPTS), OPTS))
    order = ["v_acc_out_sum_ws = ws_ptr + v_acc_out_sum_tile.to(gl.int64) * 12288",  # 2 accumulators x 3 parts
             "gl.store(v_acc_out_sum_ws + (pid_k) * 2048 + v_acc_out_sum_off, v_acc_out_done",
             "gl.store(v_acc_out_sum_ws + 6144 + (pid_k) * 2048 + v_acc_out_sum_off, v_acc_u_out_done",
             "gl.thread_barrier()", "gl.atomic_add(locks_ptr + v_acc_out_sum_tile, 1",
             "v_acc_out_sum_last = v_acc_out_sum_seen == 2", "v_acc_out_sum = gl.zeros(", "v_acc_u_out_sum = gl.zeros(",
             "if v_acc_out_sum_last:", "for j in range(3):",
             "v_acc_out_sum = v_acc_out_sum + gl.load(v_acc_out_sum_ws + j * 2048",
             "v_acc_u_out_sum = v_acc_u_out_sum + gl.load(v_acc_out_sum_ws + 6144 + j * 2048",
             "gl.atomic_xchg(locks_ptr + v_acc_out_sum_tile, 0", "v_gate = v_acc_out_sum / (1.0 + gl.exp2(",
             "v_act = v_gate * v_acc_u_out_sum", "if v_acc_out_sum_last:", "tma.async_copy_shared_to_global(c_desc"]
    pos = 0
    for s in order:
        pos = src.index(s, pos) + len(s)
    assert src.count("gl.atomic_add(") == 1  # one arrival per CTA
