"""The swiglu GEMM (templates.gemm epilogue="swiglu"): silu(A @ Bg) * (A @ Bu) in one kernel.

The template's IR (two weights, a loop carrying two accumulators, the silu * up epilogue), what the passes make
of it (both accumulators split per chain, one ring for A and both weights, one split-K reduction), every
runtime swiglu config interpreted under every policy against torch, and the runtime's config choice and
support checks."""
from __future__ import annotations

import pytest
import torch
from programs import assert_matches_reference, fake_cuda

from torch_autows.interp import interpret_report, make_instance
from torch_autows.ir import format_program, walk
from torch_autows.passes import pipeline
from torch_autows.runtime import swiglu as rt
from torch_autows.templates.gemm import GemmRequest, build


def _lines(program) -> list[str]:
    return [ln.strip() for ln in format_program(program).splitlines()]


def test_request_validation():
    with pytest.raises(ValueError, match="epilogue 'gelu' not served; use one of none, swiglu"):
        GemmRequest(1, 1, 1, epilogue="gelu")
    with pytest.raises(ValueError, match="no bias and batch=1"):
        GemmRequest(1, 1, 1, bias=True, epilogue="swiglu")
    with pytest.raises(ValueError, match="no bias and batch=1"):
        GemmRequest(1, 1, 1, batch=2, epilogue="swiglu")
    # the default epilogue keeps the request's printed form (golden case names are built from it)
    assert "epilogue" not in repr(GemmRequest(1, 1, 1)) and "epilogue='swiglu'" in repr(
        GemmRequest(1, 1, 1, epilogue="swiglu"))


def test_template_ir():
    opts = rt.CONFIGS["swiglu_p_128x128"]
    lines = _lines(build(GemmRequest(1, 1, 1, trans_b=True, epilogue="swiglu"), opts))
    assert lines[0] == "program gemm_bf16_nt_128x128x64_swiglu"
    assert "arg b: tensor<bf16>[N, K]" in lines and "arg bu: tensor<bf16>[N, K]" in lines
    assert "arg c: tensor<bf16>[M, N] out" in lines
    assert "%acc0:f32[128,128] = zeros()" in lines and "%acc_u0:f32[128,128] = zeros()" in lines
    loop = next(ln for ln in lines if "= loop(" in ln)
    assert loop.startswith("%acc_out:f32[128,128], %acc_u_out:f32[128,128] = loop(%acc0, %acc_u0) "
                           "{iter_args=('acc', 'acc_u')")
    assert "%bu_t:bf16[128,64]@smem = load() {arg='bu', coords=('pid_n*128', 'k*64')}" in lines
    assert "%bu:bf16[64,128]@smem = trans(%bu_t)" in lines
    assert "%acc_next:f32[128,128] = mma(%a, %b, %acc)" in lines
    assert "%acc_u_next:f32[128,128] = mma(%a, %bu, %acc_u)" in lines
    assert "yield(%acc_next, %acc_u_next)" in lines
    tail = lines[lines.index("}"):]  # the epilogue after the loop, in order
    assert tail[1:5] == ["%gate:f32[128,128] = silu(%acc_out)", "%act:f32[128,128] = mul(%gate, %acc_u_out)",
                         "%out:bf16[128,128] = cast(%act)", "store(%out) {arg='c', coords=('pid_m*128', 'pid_n*128')}"]


def test_passes_split_both_accumulators_and_share_one_ring():
    p = pipeline.run(build(GemmRequest(1, 1, 1, epilogue="swiglu"), rt.CONFIGS["swiglu_p_128x128"]))
    lines = _lines(p)
    loop = next(ln for ln in lines if "= loop(" in ln)
    assert "iter_args=('acc_c0', 'acc_c1', 'acc_u_c0', 'acc_u_c1')" in loop
    # A (per chain) and both weights (shared) in one barrier ring of 48 KB a stage
    assert "barriers g0: count=4 arrivals=2 bytes=49152 channels=ch_a_c0,ch_a_c1,ch_b,ch_bu" in lines
    assert [pt.regs for pt in p.partitions] == [232, 232, 40]
    for part in ("consumer0", "consumer1"):  # each consumer retires both of its accumulators after the loop
        body = p.partition(part).body
        assert sum(o.kind == "mma" for o in walk(body)) == 2
        assert sum(o.kind == "mma_wait" for o in walk(body)) == 2


def test_split_k_reduces_both_accumulators_in_one_op():
    p = pipeline.run(build(GemmRequest(1, 1, 1, epilogue="swiglu"), rt.CONFIGS["swiglu_dec_64x128_s2"]))
    reds = [o for o in walk(p.body) if o.kind == "split_reduce"]
    assert len(reds) == 1 and reds[0].operands == ("acc_out", "acc_u_out")
    assert [r.name for r in reds[0].results] == ["acc_out_sum", "acc_u_out_sum"]
    assert "arg ws: ptr<f32>[2*S*tiles*BM*BN]" in _lines(p)


# a swap-AB config serves nn.Linear's layout ("nt") only (templates.gemm.swap_reason)
CASES = [(c, v) for c in rt.CONFIGS for v in ("nn", "nt", "tt_fp16_f32out") if v == "nt" or not rt.CONFIGS[c].swap_ab]
VARIANTS = {"nn": {}, "nt": {"trans_b": True}, "tt_fp16_f32out": {"trans_a": True, "trans_b": True, "dtype": "fp16",
                                                                  "out_dtype": "f32"}}


@pytest.mark.parametrize("config,variant", CASES)
def test_config_matches_torch_under_every_policy(config, variant):
    before = build(GemmRequest(1, 1, 1, epilogue="swiglu", **VARIANTS[variant]), rt.CONFIGS[config])
    after = pipeline.run(before)
    for seed in range(6):  # ragged M, N and K; the ring wraps
        for ins in assert_matches_reference(before, after, seed, nprog=2 + seed % 2):
            if "locks" in ins:
                assert int(ins["locks"].count_nonzero()) == 0  # the last arrivals reset every counter


def test_reference_is_swiglu():
    p = pipeline.run(build(GemmRequest(1, 1, 1, epilogue="swiglu"), rt.CONFIGS["swiglu_dec_64x128_s1"]))
    inst = make_instance(p, 0, shape=(5, 24, 40))
    a, b, bu = (inst.tensors[n].float() for n in ("a", "b", "bu"))
    ref = (torch.nn.functional.silu(a @ b) * (a @ bu)).to(torch.bfloat16)
    assert torch.equal(inst.reference["c"], ref) and "swiglu" in inst.desc


def test_interpret_report():
    before = build(GemmRequest(1, 1, 1, epilogue="swiglu"), rt.CONFIGS["swiglu_dec_128x64_s2"])
    ok, report = interpret_report(before, pipeline.run(before), seeds=2)
    assert ok, report
    assert "result: OK" in report


def test_choose_config():
    assert rt.choose_config(4096, 14336, 4096) == "swiglu_p_128x128"
    assert rt.choose_config(129, 4096, 4096) == "swiglu_p_128x128"
    for m in (1, 16, 128):
        assert rt.choose_config(m, 14336, 4096).startswith("swiglu_dec_")
    # few output tiles: split K so enough SMs stream both weights
    assert rt.CONFIGS[rt.choose_config(1, 1024, 4096)].split_k > 1
    assert rt.CONFIGS[rt.choose_config(1, 28672, 8192)].split_k == 1
    assert set(rt.CONFIGS) >= {rt.choose_config(m, n, 4096) for m in (1, 64, 512) for n in (1024, 14336)}


def test_support_reasons():
    a, w = fake_cuda(8, 256), fake_cuda(512, 256)  # nn.Linear weights [N, K]
    assert rt.support_reason(a, w.t(), w.t(), check_device=False) is None  # both transposed views
    w_kn = fake_cuda(256, 512)  # row-major [K, N]
    assert rt.support_reason(a, w_kn, w_kn, check_device=False) is None
    assert "equal shapes, strides and dtypes" in rt.support_reason(a, w.t(), w_kn, check_device=False)
    assert "equal shapes, strides and dtypes" in rt.support_reason(a, w.t(), fake_cuda(256, 256),
                                                                   check_device=False)
    assert "takes a [M, K]" in rt.support_reason(fake_cuda(2, 8, 256), w.t(), w.t(), check_device=False)
    assert "multiple of 16 bytes" in rt.support_reason(a, fake_cuda(256, 12), fake_cuda(256, 12),
                                                       check_device=False)
    cpu = torch.empty(8, 8, dtype=torch.bfloat16)
    assert "cpu" in rt.support_reason(cpu, cpu, cpu)


def test_request_keeps_the_dtype_and_size_checks():
    with pytest.raises(ValueError, match="bf16 or fp16"):
        GemmRequest(1, 1, 1, dtype="f32", epilogue="swiglu")
    with pytest.raises(ValueError, match="n must be >= 1"):
        GemmRequest(1, 0, 1, epilogue="swiglu")
