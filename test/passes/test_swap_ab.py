"""Swap-AB decode GEMM (``Options.swap_ab``, templates/gemm.py): the tile of C^T = W^T X^T, stored transposed.

The template's IR; what it refuses; the passes (split_k's reduction over the [BN, BM] accumulator); the interpreter
against torch for a few rows (M 1, 5, 16, 33), ragged N and K, with and without a bias, split 1 and 3, under every
policy; mutations of the transposed store caught; the generated store; the runtime's refusals."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from torch_autows.codegen import gluon
from torch_autows.interp import POLICIES, InterpError, interpret_report, make_instance, run_partitioned, run_sequential
from torch_autows.ir import Options, format_program, map_ops, parse_program, walk
from torch_autows.passes import data_partition, pipeline
from torch_autows.runtime import gemm as rt
from torch_autows.runtime.fallback import Unsupported
from torch_autows.templates.gemm import GemmRequest, build

# the decs_ tile shape at a small K step (the interpreter's time), a ring that wraps
OPTS = Options(block_m=16, block_n=64, block_k=32, stages=3, data_partition=1, persistent=True, swap_ab=True)
LINEAR = GemmRequest(1, 1, 1, trans_b=True)  # nn.Linear: x @ w.t()


def _lines(program) -> list[str]:
    return [ln.strip() for ln in format_program(program).splitlines()]


def test_ir_of_the_swapped_tile():
    p = build(replace(LINEAR, bias=True), OPTS)
    lines = _lines(p)
    assert lines[0] == "program gemm_bf16_nt_16x64x32_swap_bias"
    assert "arg a: tensor<bf16>[M, K]" in lines and "arg b: tensor<bf16>[N, K]" in lines
    assert "arg c: ptr<bf16>[M, N] out" in lines  # a pointer store: the tile is C^T's
    assert "grid (pid_m: cdiv(M,16), pid_n: cdiv(N,64)) persistent=True group=8" in lines
    assert any(ln.startswith("options ") and ln.endswith(" swap_ab=True") for ln in lines)
    body = lines[lines.index("body {") + 1:]
    assert body[:14] == [
        "%acc0:f32[64,16] = zeros()",
        "%acc_out:f32[64,16] = loop(%acc0) {iter_args=('acc',), lb=0, ub='cdiv(K,32)', var='k'} {",
        "%w:bf16[64,32]@smem = load() {arg='b', coords=('pid_n*64', 'k*32')}",  # the weight: wgmma's A
        "%x:bf16[16,32]@smem = load() {arg='a', coords=('pid_m*16', 'k*32')}",
        "%x_t:bf16[32,16]@smem = trans(%x)",  # the activations, K-major: wgmma's B with N = 16
        "%acc_next:f32[64,16] = mma(%w, %x_t, %acc)",
        "yield(%acc_next)",
        "}",
        "%bias_v:f32[64] = load_vec() {arg='bias', offset='pid_n*64', size='N'}",
        "%bias_col:f32[64,1] = expand(%bias_v) {axis=1}",  # per N: per accumulator row
        "%acc_bias:f32[64,16] = add(%acc_out, %bias_col)",
        "%out:bf16[64,16] = cast(%acc_bias)",
        "store_ptr(%out) {arg='c', col='pid_m*16', cols_valid='M-pid_m*16', ld='N', row='pid_n*64', "
        "rows_valid='N-pid_n*64', transposed=True}",
        "}"]
    assert parse_program(format_program(p)) == p


@pytest.mark.parametrize("kw,match", [
    ({}, "layout nn"), ({"trans_a": True, "trans_b": True}, "layout tt"),
    ({"trans_b": True, "batch": 2}, "batch > 1"), ({"trans_b": True, "residual": True}, "a residual"),
    ({"trans_b": True, "activation": "gelu_tanh"}, "activation 'gelu_tanh'")])
def test_refuses_what_it_does_not_serve(kw, match):
    with pytest.raises(ValueError, match=f"gemm template: {match}.*swap"):
        build(GemmRequest(1, 1, 1, **kw), OPTS)


def test_split_k_reduces_the_swapped_tile():
    """The workspace slot is the accumulator's [BN, BM]; the rows that exist are C's columns (N), and the transposed
    store is guarded by the summing CTA's flag."""
    opts = replace(OPTS, split_k=3)
    lines = _lines(data_partition.run(build(LINEAR, opts), opts))
    assert "grid (pid_k: 3, pid_m: cdiv(M,16), pid_n: cdiv(N,64)) persistent=True group=8" in lines
    assert ("%acc_out_sum:f32[64,16] = split_reduce(%acc_out) {index='(pid_m)*(cdiv(N,64))+pid_n', locks='locks', "
            "part='pid_k', rows_valid='N-pid_n*64', splits=3, ws='ws'} [chain=0]") in lines
    assert ("store_ptr(%out) {arg='c', col='pid_m*16', cols_valid='M-pid_m*16', ld='N', pred='acc_out_sum', "
            "row='pid_n*64', rows_valid='N-pid_n*64', transposed=True} [chain=0]") in lines


def _check(request, opts, shape, seeds=3):
    """Sequential and partitioned (every policy, 2-4 CTAs) runs equal torch bit for bit; split-K counters reset."""
    before = build(request, opts)
    after = pipeline.run(before, opts, verify=True)
    for seed in range(seeds):
        inst = make_instance(after, seed, shape=shape)
        assert torch.equal(run_sequential(data_partition.run(before, opts), inst.inputs())["c"], inst.reference["c"])
        for policy in POLICIES:
            ins = inst.inputs()
            out = run_partitioned(after, ins, policy=policy, seed=seed, nprog=2 + seed % 3)
            assert torch.equal(out["c"], inst.reference["c"]), (policy, seed, inst.desc)
            if "locks" in ins:
                assert int(ins["locks"].count_nonzero()) == 0


@pytest.mark.parametrize("m", [1, 5, 16, 33])
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("bias", [False, True])
def test_interpreter_matches_torch(m, splits, bias):
    # N: one full 64-row weight tile and a ragged one; K: ragged, 7 steps of 32 (the 3-slot ring wraps)
    _check(GemmRequest(1, 1, 1, trans_b=True, bias=bias), replace(OPTS, split_k=splits), (m, 100, 200))


@pytest.mark.parametrize("m", [1, 33])
@pytest.mark.parametrize("splits", [1, 2])
def test_swiglu_swapped_matches_torch(m, splits):
    """Both weights' tiles in wgmma's A slot, two [BN, BM] accumulators, silu(gate) * up on the transposed tiles, one
    transposed store; split-K reduces both accumulators."""
    req = GemmRequest(1, 1, 1, trans_b=True, epilogue="swiglu")
    lines = _lines(build(req, OPTS))
    assert lines[0] == "program gemm_bf16_nt_16x64x32_swap_swiglu"
    assert "%acc_u_next:f32[64,16] = mma(%wu, %x_t, %acc_u)" in lines
    assert "%act:f32[64,16] = mul(%gate, %acc_u_out)" in lines
    _check(req, replace(OPTS, split_k=splits), (m, 100, 200))


def test_fp16_f32_out_and_a_64_row_tile():
    _check(GemmRequest(1, 1, 1, "fp16", "f32", trans_b=True, bias=True),
           replace(OPTS, block_m=64, block_n=128, split_k=2), (33, 136, 72))


@pytest.mark.parametrize("config", [c for c, o in rt.CONFIGS.items() if o.swap_ab and o.block_m == 16])
def test_interpret_report_of_the_runtime_configs(config):
    before = build(replace(LINEAR, bias=True), rt.CONFIGS[config])
    ok, report = interpret_report(before, pipeline.run(before), seeds=2)
    assert ok, report
    assert "max |err| vs torch 0" in report


def _mutate(program, fn):
    parts = tuple(replace(p, body=map_ops(p.body, fn)) for p in program.partitions)
    return replace(program, body=map_ops(program.body, fn), partitions=parts)


def test_a_store_with_its_strides_swapped_is_caught():
    after = pipeline.run(build(LINEAR, OPTS), OPTS)
    bad = _mutate(after, lambda o: o.with_attrs(transposed=False) if o.kind == "store_ptr" else o)
    # square C: every element lands inside it, at its transposed place
    inst = make_instance(after, 0, shape=(33, 33, 96))
    assert torch.equal(run_partitioned(after, inst.inputs(), policy="random", seed=0)["c"], inst.reference["c"])
    out = run_partitioned(bad, inst.inputs(), policy="random", seed=0)["c"]
    assert not torch.equal(out, inst.reference["c"])
    assert torch.equal(out, inst.reference["c"].t())
    # a few rows of a wide C: the rows of the tile (N) run past C's M rows
    inst = make_instance(after, 1, shape=(5, 100, 96))
    with pytest.raises(InterpError, match="writes outside c"):
        run_partitioned(bad, inst.inputs(), policy="round_robin", seed=1)


def test_a_store_without_its_column_mask_is_caught():
    after = pipeline.run(build(LINEAR, OPTS), OPTS)
    bad = _mutate(after, lambda o: replace(o, attrs=tuple(kv for kv in o.attrs if kv[0] != "cols_valid"))
                  if o.kind == "store_ptr" else o)
    inst = make_instance(after, 0, shape=(5, 100, 96))  # 5 of the tile's 16 columns are rows of C
    with pytest.raises(InterpError, match="writes outside c"):
        run_partitioned(bad, inst.inputs(), policy="round_robin", seed=0)


def test_generated_transposed_store():
    src = gluon.generate(pipeline.run(build(LINEAR, replace(OPTS, split_k=2)), replace(OPTS, split_k=2)))
    assert "v_w = w_smem.index(g0_s)" in src and "v_x_t = v_x.permute((1, 0))" in src
    assert "v_acc_next = warpgroup_mma(v_w, v_x_t, v_acc, is_async=True)" in src
    assert ("    if v_acc_out_sum_last:\n"
            "            v_out_r = gl.arange(0, 64, layout=MMA_N16_S1)\n"
            "            v_out_c = gl.arange(0, 16, layout=MMA_N16_S0)\n"
            "            v_out_p = c_ptr + ((pid_m * 16 + v_out_c).to(gl.int64) * (N))[None, :] + "
            "(pid_n * 64 + v_out_r)[:, None]\n"
            "            gl.store(v_out_p, v_out, mask=(v_out_r < N - pid_n * 64)[:, None] & "
            "(v_out_c < M - pid_m * 16)[None, :])") in src
    assert "c_desc" not in src  # C is a pointer argument


def test_runtime_configs_and_refusals():
    swap = [c for c, o in rt.CONFIGS.items() if o.swap_ab]
    assert len(swap) == 18 and all(c.startswith("decs_") for c in swap)  # 16 128-deep + 2 256-deep (SWAP_DEEP_TILES)
    assert "decs_128x128_m16_s3" in swap and rt.CONFIGS["decs_128x128_m16_s3"].block_m == 16
    # not picked until measured
    assert not any(rt.choose_config(m, n, k).startswith("decs_") for m in (1, 8, 16, 64, 128)
                   for n, k in ((4096, 4096), (14336, 4096), (4096, 14336), (128256, 4096)))
    assert all(o.split_k == 1 or not rt.serves_residual(c) for c, o in rt.CONFIGS.items() if o.swap_ab)
    x, w = torch.randn(4, 64), torch.randn(32, 64)
    with pytest.raises(Unsupported, match="decs_64x128_m16_s1 is swap-AB.*row-major a and a row-major b"):
        rt.gemm(x, w.t().contiguous(), None, torch.float32, config="decs_64x128_m16_s1")
    with pytest.raises(Unsupported, match="transposed a"):
        rt.gemm(x.t().contiguous().t(), w.t(), None, torch.float32, config="decs_64x128_m16_s1")
    with pytest.raises(Unsupported, match="does not serve a residual"):
        rt.gemm(x, w.t(), None, torch.float32, config="decs_64x128_m16_s1", residual=torch.randn(4, 32))
    with pytest.raises(Unsupported, match="does not serve activation 'gelu_tanh': a swap-AB tile"):
        rt.gemm(x, w.t(), None, torch.float32, config="decs_64x128_m16_s1", activation="gelu_tanh")
    with pytest.raises(Unsupported, match="contiguous .M, N. output; out has strides .64, 1."):
        rt.gemm(x, w.t(), None, torch.float32, config="decs_64x128_m16_s1", out=torch.empty(4, 64)[:, :32])
    assert not rt.serves_swap("decs_64x128_m16_s1", trans_a=False, trans_b=False, batched=True)
    assert rt.serves_swap("dec_64x128_s1", trans_a=True, trans_b=False, batched=True)
    assert not any(o.kind == "store" for o in walk(build(LINEAR, rt.CONFIGS["decs_64x128_m64_s4"]).body))


def test_row_pointer_addressing_is_asked_for_per_store():
    """``store_ptr(row_ptr=True)``: one 64-bit pointer per column of C^T's tile (a row of C) with the row base, the
    elements i32 offsets from it (the same addresses); without the attribute the per-element form stays."""
    program = pipeline.run(build(LINEAR, OPTS), OPTS)
    asked = _mutate(program, lambda o: replace(o, attrs=tuple(sorted((*o.attrs, ("row_ptr", True)))))
                    if o.kind == "store_ptr" else o)
    src = gluon.generate(asked)
    assert "v_out_cp = c_ptr + ((pid_m * 16 + v_out_c).to(gl.int64) * (N) + (pid_n * 64))" in src
    assert "v_out_p = v_out_cp[None, :] + v_out_r[:, None]" in src
    assert "v_out_cp" not in gluon.generate(program)
