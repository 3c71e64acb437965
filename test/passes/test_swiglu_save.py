"""The SwiGLU epilogue that also stores its projections (templates.gemm ``epilogue="swiglu_save"``, a training
graph's forward): args, the epilogue's three stores (G and U each rounded once from its sum, the product from the
sums), refusals, and the runtime's config and a small one interpreted under every policy against torch (all three
outputs bit-equal)."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from torch_autows.interp import POLICIES, make_instance, run_partitioned, run_sequential
from torch_autows.ir import Options, format_program
from torch_autows.passes import pipeline
from torch_autows.runtime import swiglu as rt
from torch_autows.templates.gemm import GemmRequest, build

REQ = GemmRequest(1, 1, 1, epilogue="swiglu_save")
SMALL = Options(block_m=128, block_n=64, block_k=32, stages=3, data_partition=2, persistent=True)


def test_refusals():
    for bad in ({"bias": True}, {"residual": True}, {"batch": 2}):
        with pytest.raises(ValueError):
            GemmRequest(1, 1, 1, epilogue="swiglu_save", **bad)
    with pytest.raises(ValueError, match="split_k > 1 is not built"):
        build(REQ, replace(SMALL, split_k=2))
    with pytest.raises(ValueError, match="swiglu_save epilogue"):
        build(replace(REQ, trans_b=True), replace(SMALL, swap_ab=True, block_m=16, data_partition=1))


def test_template_ir():
    lines = [ln.strip() for ln in format_program(build(REQ, SMALL)).splitlines()]
    assert lines[0] == "program gemm_bf16_nn_128x64x32_swiglu_save"
    assert [ln for ln in lines if ln.startswith("arg ")] == [
        "arg a: tensor<bf16>[M, K]", "arg b: tensor<bf16>[K, N]", "arg bu: tensor<bf16>[K, N]",
        "arg c: tensor<bf16>[M, N] out", "arg g: tensor<bf16>[M, N] out", "arg u: tensor<bf16>[M, N] out",
        "arg M: i32", "arg N: i32", "arg K: i32"]
    tail = lines[lines.index("}") + 1:-1]
    assert tail == [
        "%g_out:bf16[128,64] = cast(%acc_out)", "store(%g_out) {arg='g', coords=('pid_m*128', 'pid_n*64')}",
        "%u_out:bf16[128,64] = cast(%acc_u_out)", "store(%u_out) {arg='u', coords=('pid_m*128', 'pid_n*64')}",
        "%gate:f32[128,64] = silu(%acc_out)", "%act:f32[128,64] = mul(%gate, %acc_u_out)",
        "%out:bf16[128,64] = cast(%act)", "store(%out) {arg='c', coords=('pid_m*128', 'pid_n*64')}"]


@pytest.mark.parametrize("options", ["runtime", "small"])
def test_matches_torch_under_every_policy(options):
    opts = rt.CONFIGS[rt.SAVE_CONFIG] if options == "runtime" else SMALL
    variants = [{}, {"trans_b": True}, {"dtype": "fp16"}]
    for seed in range(3):
        before = build(replace(REQ, **variants[seed]), opts)
        after = pipeline.run(before, verify=True)
        inst = make_instance(after, seed)
        assert set(inst.reference) == {"c", "g", "u"}
        a, b = inst.tensors["a"].float(), inst.tensors["b"].float()
        b = b.t() if variants[seed].get("trans_b") else b
        assert torch.equal(inst.reference["g"], (a @ b).to(inst.reference["g"].dtype))  # one rounding of the sum
        seq = run_sequential(before, inst.inputs())
        assert all(torch.equal(seq[k], inst.reference[k]) for k in inst.reference), inst.desc
        for policy in POLICIES:
            out = run_partitioned(after, inst.inputs(), policy=policy, seed=seed, nprog=2 + seed % 2)
            for k in inst.reference:
                assert torch.equal(out[k], inst.reference[k]), (k, policy, seed, inst.desc)
