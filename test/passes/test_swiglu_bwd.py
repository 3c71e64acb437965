"""The SwiGLU backward epilogue (templates.gemm ``epilogue="swiglu_bwd"``): dh = A @ B stays in registers, the
epilogue reads the saved G and U tiles and writes dG (arg ``c``) and du.

The template's IR (args, the epilogue's order: one sigmoid for both gradients, du stored before U is read), the
passes' placement (G and U by TMA through the producer, their slots staging the two stores), every runtime config
and the pointer form interpreted under every policy against torch (both outputs bit-equal), and a mutated
epilogue caught by the interpreter's reference."""
from __future__ import annotations

import re
from dataclasses import replace

import pytest
import torch
from programs import violation_kinds

from torch_autows.interp import POLICIES, make_instance, run_partitioned, run_sequential
from torch_autows.ir import Options, format_program, parse_program, walk
from torch_autows.passes import pipeline
from torch_autows.runtime import swiglu_bwd as rt
from torch_autows.templates.gemm import GemmRequest, build

REQ = GemmRequest(1, 1, 1, epilogue="swiglu_bwd")
SMALL = Options(block_m=128, block_n=64, block_k=32, stages=3, data_partition=2, persistent=True)


def _lines(program) -> list[str]:
    return [ln.strip() for ln in format_program(program).splitlines()]


@pytest.mark.parametrize("bad", [{"bias": True}, {"residual": True}, {"batch": 2}, {"activation": "gelu"},
                                 {"rope": 64}])
def test_request_refuses_other_epilogues(bad):
    with pytest.raises(ValueError):
        GemmRequest(1, 1, 1, epilogue="swiglu_bwd", **bad)


def test_template_refuses_split_k_and_swap_ab():
    with pytest.raises(ValueError, match="split_k > 1 is not built"):
        build(REQ, replace(SMALL, split_k=2))
    with pytest.raises(ValueError, match="swiglu_bwd epilogue"):
        build(replace(REQ, trans_b=True), replace(SMALL, swap_ab=True, block_m=16, data_partition=1))


def test_template_ir():
    lines = _lines(build(REQ, SMALL))
    assert lines[0] == "program gemm_bf16_nn_128x64x32_swiglu_bwd"
    assert [ln for ln in lines if ln.startswith("arg ")] == [
        "arg a: tensor<bf16>[M, K]", "arg b: tensor<bf16>[K, N]", "arg c: tensor<bf16>[M, N] out",
        "arg du: tensor<bf16>[M, N] out", "arg g: ptr<bf16>[M, N]", "arg u: ptr<bf16>[M, N]", "arg M: i32",
        "arg N: i32", "arg K: i32"]
    tail = lines[lines.index("}") + 1:-1]  # the epilogue, between the K loop and the body's end
    assert tail == [
        "%g_tile:f32[128,64] = load_ptr() {arg='g', col='pid_n*64', cols_valid='N-pid_n*64', ld='N', "
        "row='pid_m*128', rows_valid='M-pid_m*128'}",
        "%sig_g:f32[128,64] = sigmoid(%g_tile)", "%silu_g:f32[128,64] = mul(%g_tile, %sig_g)",
        "%d_up:f32[128,64] = mul(%acc_out, %silu_g)", "%dsilu_g:f32[128,64] = silu_grad(%g_tile, %sig_g)",
        "%d_act:f32[128,64] = mul(%acc_out, %dsilu_g)", "%du_out:bf16[128,64] = cast(%d_up)",
        "store(%du_out) {arg='du', coords=('pid_m*128', 'pid_n*64')}",
        "%u_tile:f32[128,64] = load_ptr() {arg='u', col='pid_n*64', cols_valid='N-pid_n*64', ld='N', "
        "row='pid_m*128', rows_valid='M-pid_m*128'}",
        "%d_gate:f32[128,64] = mul(%d_act, %u_tile)", "%out:bf16[128,64] = cast(%d_gate)",
        "store(%out) {arg='c', coords=('pid_m*128', 'pid_n*64')}"]


def test_runtime_config_takes_g_and_u_by_tma_and_stages_the_stores_in_their_slots():
    p = pipeline.run(build(REQ, rt.CONFIGS["swiglu_bwd_p_128x128"]))  # whole tiles (the chunked: below)
    loads = [o.attr("arg") for o in walk(p.partition("producer").body) if o.kind == "load"]
    assert loads.count("g") == 2 and loads.count("u") == 2  # one tile per chain, after the K loop's a and b
    for c in (0, 1):
        stores = {o.attr("arg"): o.attr("stage") for o in walk(p.partition(f"consumer{c}").body) if o.kind == "store"}
        assert stores == {"du": f"g_tile_s_c{c}", "c": f"u_tile_s_c{c}"}
    assert p.smem_bytes <= 232448


def _both_match(before, after, seed: int, nprog: int, policies=POLICIES) -> None:
    inst = make_instance(after, seed)
    assert set(inst.reference) == {"c", "du"} and "swiglu_bwd" in inst.desc
    seq = run_sequential(before, inst.inputs())
    assert all(torch.equal(seq[k], inst.reference[k]) for k in ("c", "du")), inst.desc
    for policy in policies:
        out = run_partitioned(after, inst.inputs(), policy=policy, seed=seed, nprog=nprog)
        for k in ("c", "du"):
            assert torch.equal(out[k], inst.reference[k]), (k, policy, seed, inst.desc)


@pytest.mark.parametrize("options", [*rt.CONFIGS, "pointers"])
def test_matches_torch_under_every_policy(options):
    opts = SMALL if options == "pointers" else rt.CONFIGS[options]
    variants = [{}, {"trans_b": True}, {"trans_a": True, "dtype": "fp16"}]
    for seed in range(3):  # ragged M, N and K (masked rows and columns of G and U); the ring wraps
        before = build(replace(REQ, **variants[seed]), opts)
        _both_match(before, pipeline.run(before, verify=True), seed, nprog=2 + seed % 2)


def test_reference_is_the_product_gradients():
    after = pipeline.run(build(REQ, SMALL))
    inst = make_instance(after, 0, shape=(100, 72, 96))
    a, b, g, u = (inst.tensors[n].float() for n in ("a", "b", "g", "u"))
    dh = a @ b
    s = torch.sigmoid(g)
    torch.testing.assert_close(inst.reference["du"].float(), dh * g * s, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(inst.reference["c"].float(), dh * u * s * (1 + g * (1 - s)), rtol=1e-2, atol=1e-2)
    assert g.abs().sum() > 0 and u.abs().sum() > 0


@pytest.mark.parametrize("mutation", [
    (r"mul\(%d_act_c(\d), %u_tile_c\1\)", r"mul(%d_act_c\1, %g_tile_c\1)"),  # dG from G instead of U
    (r"silu_grad\(%g_tile_c(\d), %sig_g_c\1\)", r"silu_grad(%sig_g_c\1, %g_tile_c\1)"),  # operands swapped
    (r"mul\(%acc_out_c(\d)_done, %silu_g_c\1\)", r"mul(%acc_out_c\1_done, %sig_g_c\1)"),  # du lacks G's factor
])
def test_a_mutated_epilogue_is_caught(mutation):
    after = pipeline.run(build(REQ, SMALL))
    bad, n = re.subn(*mutation, format_program(after))
    assert n >= 2  # in each consumer's body
    inst = make_instance(after, 0)
    out = run_partitioned(parse_program(bad), inst.inputs(), policy="random", seed=0, nprog=2)
    assert not inst.matches(out)


# ---- the epilogue in column chunks (Options.epilogue_chunk): a 256-wide tile's temporaries in a chunk's registers

CHUNKED = Options(block_m=128, block_n=256, block_k=32, stages=3, data_partition=2, persistent=True,
                  epilogue_tma=True, epilogue_chunk=64)
PING_PONG = replace(CHUNKED, block_n=128, block_k=64, data_partition=1, tile_consumers=2)


def test_chunked_template_ir():
    """The accumulator split in 4 register chunks; per chunk: G's columns read through a slice of its TMA tile, du
    stored at the chunk's columns, then U's columns read and dG stored; no whole-tile read of G or U."""
    p = build(REQ, CHUNKED)
    tail = _lines(p)[_lines(p).index("}") + 1:-1]
    assert tail[:3] == ["%g_tile_s:bf16[128,256]@smem = load() {arg='g', coords=('pid_m*128', 'pid_n*256')}",
                        "%u_tile_s:bf16[128,256]@smem = load() {arg='u', coords=('pid_m*128', 'pid_n*256')}",
                        "%acc_out_k0:f32[128,64], %acc_out_k1:f32[128,64], %acc_out_k2:f32[128,64], "
                        "%acc_out_k3:f32[128,64] = col_split(%acc_out)"]
    stores = [ln for ln in tail if ln.startswith("store(")]
    assert stores == [f"store(%{x}_k{i}) {{arg='{a}', coords=('pid_m*128', '{col}')}}"
                      for i, col in enumerate(("pid_n*256", "pid_n*256+64", "pid_n*256+128", "pid_n*256+192"))
                      for x, a in (("du_out", "du"), ("out", "c"))]
    reads = [ln for ln in tail if "slice(" in ln]
    assert reads[:2] == ["%g_s_k0:bf16[128,64]@smem = slice(%g_tile_s) {size=64, start=0}",
                         "%u_s_k0:bf16[128,64]@smem = slice(%u_tile_s) {size=64, start=0}"]
    assert not any("smem_read(%g_tile_s)" in ln or "smem_read(%u_tile_s)" in ln for ln in tail)


@pytest.mark.parametrize("bad,match", [({"epilogue_chunk": 96}, "power of two"), ({"epilogue_chunk": 8}, "16"),
                                       ({"epilogue_tma": False}, "epilogue_tma=True")])
def test_chunked_template_refuses(bad, match):
    with pytest.raises(ValueError, match=match):
        build(REQ, replace(CHUNKED, **bad))
    with pytest.raises(ValueError, match="swiglu_bwd and RoPE epilogues only"):
        build(GemmRequest(1, 1, 1, residual=True), CHUNKED)


def test_chunked_stores_stage_in_the_columns_just_read_and_wait_once():
    """Each chunk's du stages in the slice of G it was computed from, its dG in U's (passes/buffers); every staged
    store but each partition's last leaves its wait to the next (ir.deferred_stage_waits), which comes before the
    slots' release."""
    from torch_autows.ir import deferred_stage_waits

    p = pipeline.run(build(REQ, CHUNKED), verify=True)
    for c in (0, 1):
        body = p.partition(f"consumer{c}").body
        stores = [o for o in walk(body) if o.kind == "store"]
        assert [o.attr("stage") for o in stores] == [f"{t}_s_k{i}_c{c}" for i in range(4) for t in ("g", "u")]
        deferred = deferred_stage_waits(body)
        assert [id(o) in deferred for o in stores] == [True] * 7 + [False]
        flat = list(walk(body))
        last = next(i for i, o in enumerate(flat) if o is stores[-1])
        assert [o.kind for o in flat[last + 1:]] == ["release", "advance"]  # the slots' release right after it


@pytest.mark.parametrize("opts", [CHUNKED, PING_PONG, replace(PING_PONG, epilogue_chunk=32)],
                         ids=["two_chains", "ping_pong", "ping_pong_narrow"])
def test_chunked_matches_torch_under_every_policy(opts):
    """The chunked epilogue on a tile split between two chains, and on whole tiles two consumers take turns over (G's
    and U's tiles shared by the consumers' fills, each fill one consumer's tile); chunks narrower than a 128-byte
    swizzle row stage their stores in buffers of their own."""
    variants = [{}, {"trans_b": True}, {"trans_a": True, "dtype": "fp16"}]
    for seed in range(3):  # ragged M, N and K: chunks past N read zeros and TMA clips their stores
        before = build(replace(REQ, **variants[seed]), opts)
        _both_match(before, pipeline.run(before, verify=True), seed, nprog=2 + seed % 2)


def test_a_chunk_read_from_columns_already_staged_over_is_caught():
    """G's chunk 1 read from columns 0..63, which hold chunk 0's staged du by then: the interpreter's slot model
    tracks the columns a staged store wrote (an ``unfilled-read``), not only whole slots."""
    after = pipeline.run(build(REQ, CHUNKED))
    bad, n = re.subn(r"(%g_s_k1_c\d:bf16\[64,64\]@smem = slice\(%g_tile_s_c\d\) \{size=64, start=)64", r"\g<1>0",
                     format_program(after))
    assert n == 4  # each chain's, in the body and in its partition
    assert set(violation_kinds(parse_program(bad), seeds=1, policies=("round_robin",))) == {"unfilled-read"}


def test_a_release_before_the_last_chunk_store_is_caught():
    """The staged stores' deferred waits hold only while the slots' release follows the last of them: moved before
    it, the slots go back to the producer while TMA still reads them."""
    lines = format_program(pipeline.run(build(REQ, CHUNKED))).splitlines()
    moved = 0
    for i, ln in enumerate(lines):
        if ln.strip() == "release() {group='g1', lag=0}" and lines[i - 1].strip().startswith("store("):
            lines[i - 1], lines[i] = lines[i], lines[i - 1]
            moved += 1
    assert moved == 2
    kinds = set(violation_kinds(parse_program("\n".join(lines)), seeds=1, policies=("round_robin",)))
    assert kinds and kinds <= {"release-before-retire", "use-after-release", "overwrite"}


@pytest.mark.parametrize("req,form", [(REQ, "chains"), (REQ, "ping_pong"), (GemmRequest(1, 1, 1, bias=True,
                                                                                      residual=True), "chains")],
                         ids=["swiglu_bwd", "swiglu_bwd_ping_pong", "residual"])
def test_prefetched_epilogue_operands_match_torch(req, form):
    """``Options.epilogue_prefetch``: the epilogue's TMA loads move before the K loop (the producer issues them at the
    tile's start, the consumers read them after their K steps), for any epilogue operand; the interpreter agrees with
    torch under every policy, and the option without TMA operands is refused."""
    opts = CHUNKED if req.epilogue == "swiglu_bwd" else replace(CHUNKED, epilogue_chunk=0)
    if form == "ping_pong":  # two copies of G and U, so one consumer's turn does not wait on the other's slot
        opts = replace(PING_PONG, epilogue_chunk=32, tile_buffers=2)
    opts = replace(opts, epilogue_prefetch=True)
    before = build(req, opts)
    loop = next(i for i, o in enumerate(before.body) if o.kind == "loop")
    assert {o.attr("arg") for o in before.body[:loop] if o.kind == "load"} == (
        {"g", "u"} if req.epilogue == "swiglu_bwd" else {"r"})
    after = pipeline.run(before, verify=True)
    for seed in range(2):
        inst = make_instance(after, seed)
        for policy in POLICIES:
            out = run_partitioned(after, inst.inputs(), policy=policy, seed=seed, nprog=2)
            assert inst.matches(out), (policy, seed, inst.desc)
    with pytest.raises(ValueError, match="epilogue_prefetch"):
        build(GemmRequest(1, 1, 1), replace(opts, epilogue_chunk=0))
