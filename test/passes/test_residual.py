"""The residual epilogue (templates.gemm ``GemmRequest.residual``): C = A @ B (+ bias) + R in one kernel.

The template's IR (arg ``r``, a ``load_ptr`` of R's tile and an fp32 add after the bias, before the cast), what the
passes make of it (the load split by rows per chain, run by each chain's consumer, no SMEM ring or channel for
it), the verifier on its expressions, every runtime GEMM config interpreted under every policy against torch
(split-K configs included: R is added once, to the reduced sum), and the masked load at ragged edges."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from programs import assert_matches_reference

from torch_autows.interp import make_instance, run_partitioned
from torch_autows.ir import Options, format_program, parse_program, walk
from torch_autows.passes import pipeline
from torch_autows.runtime import gemm as rt
from torch_autows.templates.gemm import GemmRequest, build
from torch_autows.verify import VerifyError, check

SMALL = Options(block_m=128, block_n=64, block_k=32, stages=3, data_partition=2, persistent=True)


def _lines(program) -> list[str]:
    return [ln.strip() for ln in format_program(program).splitlines()]


def test_request():
    # the default keeps the request's printed form (golden case names and kernel names are built from it)
    assert "residual" not in repr(GemmRequest(1, 1, 1, bias=True))
    assert "residual=True" in repr(GemmRequest(1, 1, 1, residual=True))
    with pytest.raises(ValueError, match="swiglu epilogue takes no residual"):
        GemmRequest(1, 1, 1, epilogue="swiglu", residual=True)
    assert build(GemmRequest(1, 1, 1, bias=True), SMALL).name == "gemm_bf16_nn_128x64x32_bias"


def test_template_ir():
    lines = _lines(build(GemmRequest(1, 1, 1, bias=True, residual=True), SMALL))
    assert lines[0] == "program gemm_bf16_nn_128x64x32_bias_res"
    args = [ln for ln in lines if ln.startswith("arg ")]
    assert args == ["arg a: tensor<bf16>[M, K]", "arg b: tensor<bf16>[K, N]", "arg c: tensor<bf16>[M, N] out",
                    "arg bias: ptr<bf16>[N]", "arg r: ptr<bf16>[M, N]", "arg M: i32", "arg N: i32", "arg K: i32"]
    tail = lines[lines.index("}"):]  # the epilogue after the loop, in order: bias, residual, one cast
    assert tail[4:8] == [
        "%res:f32[128,64] = load_ptr() {arg='r', col='pid_n*64', cols_valid='N-pid_n*64', ld='N', row='pid_m*128', "
        "rows_valid='M-pid_m*128'}",
        "%acc_res:f32[128,64] = add(%acc_bias, %res)", "%out:bf16[128,64] = cast(%acc_res)",
        "store(%out) {arg='c', coords=('pid_m*128', 'pid_n*64')}"]
    # batched: R is [batch*M, N] like c, each batch's rows after the previous batch's
    b = _lines(build(GemmRequest(1, 1, 1, residual=True, batch=4), SMALL))
    assert any("load_ptr() {arg='r', col='pid_n*64', cols_valid='N-pid_n*64', ld='N', row='pid_b*M+pid_m*128', "
               "rows_valid='M-pid_m*128'}" in ln for ln in b)


def test_passes_split_it_by_rows_into_the_consumers():
    p = pipeline.run(build(GemmRequest(1, 1, 1, residual=True), SMALL))
    for c, row in ((0, "pid_m*128"), (1, "pid_m*128+64")):
        loads = [o for o in walk(p.partition(f"consumer{c}").body) if o.kind == "load_ptr"]
        assert len(loads) == 1 and loads[0].result.type.shape == (64, 64)
        assert loads[0].attr("row") == row and loads[0].attr("rows_valid") == f"M-{row}".replace("+", "-")
    assert not any(o.kind == "load_ptr" for o in walk(p.partition("producer").body))
    # no SMEM for R: the buffers and rings are those of the GEMM without it
    plain = pipeline.run(build(GemmRequest(1, 1, 1), SMALL))
    assert p.buffers == plain.buffers and p.groups == plain.groups and p.smem_bytes == plain.smem_bytes


def test_split_k_adds_the_residual_after_the_reduction():
    p = pipeline.run(build(GemmRequest(1, 1, 1, residual=True), rt.CONFIGS["dec_64x128_s2"]))
    lines = _lines(p)
    consumer = lines[lines.index("code consumer0 {"):lines.index("code producer {")]
    red = next(i for i, ln in enumerate(consumer) if "= split_reduce(" in ln)
    res = next(i for i, ln in enumerate(consumer) if "= load_ptr(" in ln)
    add = next(i for i, ln in enumerate(consumer) if ln.startswith("%acc_res:"))
    assert red < res < add and "add(%acc_out_sum, %res)" in consumer[add]
    assert "pred='acc_out_sum'" in next(ln for ln in consumer if ln.startswith("store("))


def test_verifier_checks_its_expressions():
    text = format_program(build(GemmRequest(1, 1, 1, residual=True), SMALL))
    check(parse_program(text), "template")
    with pytest.raises(VerifyError, match=r"uses unknown names \['NN'\]"):
        check(parse_program(text.replace("ld='N'", "ld='NN'")), "template")


@pytest.mark.parametrize("config", [c for c, o in rt.CONFIGS.items() if not o.swap_ab])  # swap-AB: no residual
def test_config_matches_torch_under_every_policy(config):
    variants = [{}, {"bias": True, "trans_b": True}, {"trans_a": True, "dtype": "fp16", "out_dtype": "f32"}]
    for seed in range(3):  # ragged M, N and K (masked rows and columns of R); the ring wraps
        before = build(GemmRequest(1, 1, 1, residual=True, **variants[seed]), rt.CONFIGS[config])
        assert_matches_reference(before, pipeline.run(before, verify=True), seed, nprog=2 + seed % 2)


def test_batched_matches_torch():
    opts = replace(rt.CONFIGS["ws_p_128x128"], block_k=32)
    before = build(GemmRequest(1, 1, 1, residual=True, batch=2), opts)
    after = pipeline.run(before, verify=True)
    inst = make_instance(after, 0)
    out = run_partitioned(after, inst.inputs(), policy="random", seed=0, nprog=3)
    assert torch.equal(out["c"], inst.reference["c"]), inst.desc


def test_reference_adds_r_once_and_the_load_is_masked():
    # a decode shape: 5 rows of a 64-row tile and 24 of a 128-wide tile are R; the rest of the tile reads 0
    before = build(GemmRequest(1, 1, 1, residual=True), rt.CONFIGS["dec_128x128_s3"])
    after = pipeline.run(before)
    inst = make_instance(after, 0, shape=(5, 24, 400))
    a, b, r = (inst.tensors[n].float() for n in ("a", "b", "r"))
    assert torch.equal(inst.reference["c"], (a @ b + r).to(torch.bfloat16)) and "residual" in inst.desc
    assert r.abs().sum() > 0  # so a residual added once per part (3 times) would not match
    out = run_partitioned(after, inst.inputs(), policy="adversarial", seed=1, nprog=3)
    assert torch.equal(out["c"], inst.reference["c"])
