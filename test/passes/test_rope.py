"""The RoPE epilogue (templates.gemm ``GemmRequest.rope``): C = rope(A @ B (+ bias)) in one kernel, the Llama q/k
projections' rotary embedding applied to the fp32 accumulator before the one rounding (issue 16, item 3).

The template's IR (args cos/sin [P, D] and P, two periodic ``load_ptr`` tiles, a ``rotate_half``, two muls and an
add after the bias), the op's meaning pinned to the models' ``rotate_half`` (the Llama example's ``apply_rope``),
what the passes make of it (the tables' loads split by rows per chain, no SMEM for them), every config serving it
interpreted under every policy against torch (split-K ones included: the CTA that stores rotates the reduced sum),
and a mutated rotation caught."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from programs import assert_matches_reference

from torch_autows.bench.llama import apply_rope
from torch_autows.interp import make_instance, run_partitioned
from torch_autows.ir import Op, format_program, parse_program, walk
from torch_autows.passes import pipeline
from torch_autows.runtime import gemm as rt
from torch_autows.runtime.fallback import Unsupported
from torch_autows.templates.gemm import GemmRequest, build
from torch_autows.verify import VerifyError, check

SMALL = rt.CONFIGS["ws_p_128x128"]


def _lines(program) -> list[str]:
    return [ln.strip() for ln in format_program(program).splitlines()]


def test_request():
    assert "rope" not in repr(GemmRequest(1, 1, 1, bias=True))  # golden case names stay as they were
    assert "rope=128" in repr(GemmRequest(1, 1, 1, rope=128))
    for bad in ({"rope": 63}, {"rope": -2}, {"rope": 64, "residual": True}, {"rope": 64, "epilogue": "swiglu"},
                {"rope": 64, "activation": "gelu"}, {"rope": 64, "batch": 2}):
        with pytest.raises(ValueError, match="rope="):
            GemmRequest(1, 1, 1, **bad)
    with pytest.raises(ValueError, match="block_n=128 is not a multiple"):
        build(GemmRequest(1, 1, 1, rope=96), SMALL)
    assert build(GemmRequest(1, 1, 1, trans_b=True, rope=128), SMALL).name == "gemm_bf16_nt_128x128x64_rope128"


def test_template_ir():
    lines = _lines(build(GemmRequest(1, 1, 1, trans_b=True, bias=True, rope=64), SMALL))
    args = [ln for ln in lines if ln.startswith("arg ")]
    assert args == ["arg a: tensor<bf16>[M, K]", "arg b: tensor<bf16>[N, K]", "arg c: tensor<bf16>[M, N] out",
                    "arg bias: ptr<bf16>[N]", "arg cos: ptr<bf16>[P, 64]", "arg sin: ptr<bf16>[P, 64]",
                    "arg M: i32", "arg N: i32", "arg K: i32", "arg P: i32"]
    tail = lines[lines.index("}"):]  # after the loop: bias, the tables, the rotation, one cast
    assert tail[4:11] == [
        "%cos_tile:f32[128,128] = load_ptr() {arg='cos', col='0', col_mod='64', cols_valid='N-pid_n*128', ld='64', "
        "row='pid_m*128', row_mod='P', rows_valid='M-pid_m*128'}",
        "%sin_tile:f32[128,128] = load_ptr() {arg='sin', col='0', col_mod='64', cols_valid='N-pid_n*128', ld='64', "
        "row='pid_m*128', row_mod='P', rows_valid='M-pid_m*128'}",
        "%acc_rot:f32[128,128] = rotate_half(%acc_bias) {width=64}",
        "%acc_cos:f32[128,128] = mul(%acc_bias, %cos_tile)", "%acc_sin:f32[128,128] = mul(%acc_rot, %sin_tile)",
        "%acc_rope:f32[128,128] = add(%acc_cos, %acc_sin)", "%out:bf16[128,128] = cast(%acc_rope)"]


def test_rotate_half_is_the_models():
    """The op's interpreter meaning, and so the reference, against the Llama example's apply_rope (cat(-x2, x1)
    per head, x * cos + rotated * sin) on a tile of two heads."""
    from torch_autows.interp.ops import SEMANTICS
    from torch_autows.ir import TileType, Value

    x = torch.randn(6, 256)
    cos, sin = torch.randn(6, 128), torch.randn(6, 128)
    o = Op("rotate_half", (Value("r", TileType("f32", (6, 256))),), ("x",), (("width", 128),))
    rot = SEMANTICS["rotate_half"](None, o, [x])
    ours = x * cos.repeat(1, 2) + rot * sin.repeat(1, 2)
    heads = x.view(6, 2, 128).transpose(0, 1)  # [heads, rows, D], as the model's [B, H, S, D]
    theirs = apply_rope(heads, cos, sin).transpose(0, 1).reshape(6, 256)
    torch.testing.assert_close(ours, theirs)


def test_passes_split_the_tables_by_rows_into_the_consumers():
    p = pipeline.run(build(GemmRequest(1, 1, 1, trans_b=True, rope=128), SMALL))
    for c, row in ((0, "pid_m*128"), (1, "pid_m*128+64")):
        body = list(walk(p.partition(f"consumer{c}").body))
        loads = [o for o in body if o.kind == "load_ptr"]
        assert [o.attr("arg") for o in loads] == ["cos", "sin"]
        assert all(o.result.type.shape == (64, 128) and o.attr("row") == row and o.attr("row_mod") == "P"
                   for o in loads)
        assert [o.result.type.shape for o in body if o.kind == "rotate_half"] == [(64, 128)]
    assert not any(o.kind in ("load_ptr", "rotate_half") for o in walk(p.partition("producer").body))
    plain = pipeline.run(build(GemmRequest(1, 1, 1, trans_b=True), SMALL))
    assert p.buffers == plain.buffers and p.groups == plain.groups and p.smem_bytes == plain.smem_bytes


def test_verifier_checks_its_expressions():
    text = format_program(build(GemmRequest(1, 1, 1, rope=64), SMALL))
    check(parse_program(text), "template")
    with pytest.raises(VerifyError, match=r"uses unknown names \['PP'\]"):
        check(parse_program(text.replace("row_mod='P'", "row_mod='PP'")), "template")


@pytest.mark.parametrize("config", [c for c in rt.CONFIGS if rt.serves_rope(c, 64)])
def test_config_matches_torch_under_every_policy(config):
    variants = [{"trans_b": True, "rope": 64}, {"trans_b": True, "bias": True, "rope": 128},
                {"dtype": "fp16", "out_dtype": "f32", "rope": 64}]
    for seed, kw in enumerate(variants):  # ragged M and K, N whole heads, random periods; the ring wraps
        if not rt.serves_rope(config, kw["rope"]):
            continue
        before = build(GemmRequest(1, 1, 1, **kw), rt.CONFIGS[config])
        assert_matches_reference(before, pipeline.run(before, verify=True), seed, nprog=2 + seed % 2)


def test_reference_rotates_and_a_mutated_rotation_is_caught():
    before = build(GemmRequest(1, 1, 1, trans_b=True, rope=64), replace(SMALL, block_k=32))
    after = pipeline.run(before)
    inst = make_instance(after, 3, shape=(200, 128, 96))
    assert "rope(64" in inst.desc and inst.scalars["P"] <= 200
    a, b = inst.tensors["a"].float(), inst.tensors["b"].float()
    x = (a @ b.t()).view(200, 2, 64).transpose(0, 1)  # two heads of 64
    pos = torch.arange(200) % inst.scalars["P"]
    want = apply_rope(x, inst.tensors["cos"].float()[pos], inst.tensors["sin"].float()[pos])
    assert torch.equal(inst.reference["c"], want.transpose(0, 1).reshape(200, 128).to(torch.bfloat16))
    out = run_partitioned(after, inst.inputs(), policy="adversarial", seed=1, nprog=3)
    assert torch.equal(out["c"], inst.reference["c"])
    # the rotation over whole 128-column tiles instead of 64-column heads: a different permutation, caught
    text = format_program(after).replace("width=64", "width=128")
    bad = run_partitioned(parse_program(text), inst.inputs(), policy="random", seed=0, nprog=2)
    assert not torch.equal(bad["c"], inst.reference["c"])


def test_runtime_checks_and_config(monkeypatch):
    """runtime.gemm_rope: the reasons it gives (on CPU tensors with the device check passed) and its config choice."""
    from torch_autows.runtime import device as dev
    from torch_autows.runtime import gemm_rope

    monkeypatch.setattr(dev, "sm90_reason", lambda device, check_device=True: None)
    bf = torch.bfloat16
    a, w = torch.randn(256, 512, dtype=bf), torch.randn(384, 512, dtype=bf)
    cos, sin = torch.randn(64, 128, dtype=bf), torch.randn(64, 128, dtype=bf)
    assert gemm_rope.rope_reason(a, w.t(), cos, sin) is None
    assert "multiple of the head dim 128" in gemm_rope.rope_reason(a, w[:320].t(), cos, sin)
    assert "even head dim" in gemm_rope.rope_reason(a, w.t(), cos[:, :3], sin[:, :3])
    assert "must both be [P, D]" in gemm_rope.rope_reason(a, w.t(), cos, sin[:32])
    assert "operands' dtype" in gemm_rope.rope_reason(a, w.t(), cos.float(), sin.float())
    assert "contiguous" in gemm_rope.rope_reason(a, w.t(), cos.t().contiguous().t(), sin)
    assert "2-D" in gemm_rope.rope_reason(a.view(2, 128, 512), w.t(), cos, sin)
    for m in (1, 8, 128, 129, 8192):
        for d in (64, 128):
            for n, k in ((4096, 4096), (1024, 4096), (128, 14336)):
                assert rt.serves_rope(gemm_rope.choose_config(m, n, k, d), d)
    assert rt.CONFIGS[gemm_rope.choose_config(8, 1024, 4096, 128)].split_k > 1  # 8 tiles of N: split K to stream it
    assert gemm_rope.choose_config(8192, 4096, 4096, 128) == "ws_p_128x128"
    with pytest.raises(ValueError, match="does not serve the RoPE epilogue at head dim 128"):
        gemm_rope.gemm_rope(a, w.t(), cos, sin, config="ws_p_128x256")


# ---- RoPE in half-head column chunks of a 128x256 tile (runtime.gemm_rope.WIDE, Options.epilogue_chunk = D/2)


def _wide():
    from torch_autows.runtime.gemm_rope import WIDE

    return WIDE["rope_p_128x256"]


def test_chunked_template_ir():
    """The accumulator in 4 register chunks (two heads' halves); each half-head chunk reads its half of the tables
    through slices of their TMA tiles (one [BM, D] tile each, for both heads) and is stored at once; x1 cos1 - x2 sin1
    and x2 cos2 + x1 sin2 need no rotate_half."""
    lines = _lines(build(GemmRequest(1, 1, 1, trans_b=True, rope=128), _wide()))
    assert "%cos_tile_s:bf16[128,128]@smem = load() {arg='cos', coords=('(pid_m*128)%P', '0')}" in lines
    assert "%acc_out_k0:f32[128,64], %acc_out_k1:f32[128,64], %acc_out_k2:f32[128,64], %acc_out_k3:f32[128,64] = " \
           "col_split(%acc_out)" in lines
    assert "%cos_s1:bf16[128,64]@smem = slice(%cos_tile_s) {size=64, start=64}" in lines
    assert not any("rotate_half" in ln for ln in lines)
    assert ["%rc_h1_0:f32[128,64] = mul(%acc_out_k2, %cos_h1_0)", "%rope_h1_0:f32[128,64] = sub(%rc_h1_0, %rs_h1_0)",
            "%rs_h1_0:f32[128,64] = mul(%acc_out_k3, %sin_h1_0)"] == sorted(
        ln for ln in lines if ln.startswith(("%rope_h1_0:", "%rc_h1_0:", "%rs_h1_0:")))
    stores = [ln for ln in lines if ln.startswith("store(")]
    assert [ln[ln.index("coords"):] for ln in stores] == [
        "coords=('pid_m*128', 'pid_n*256')}", "coords=('pid_m*128', 'pid_n*256+64')}",
        "coords=('pid_m*128', 'pid_n*256+128')}", "coords=('pid_m*128', 'pid_n*256+192')}"]


@pytest.mark.parametrize("bad,match", [({"epilogue_chunk": 32}, "D/2 = 64"), ({"epilogue_tma": False}, "TMA tiles")])
def test_chunked_template_refuses(bad, match):
    with pytest.raises(ValueError, match=match):
        build(GemmRequest(1, 1, 1, trans_b=True, rope=128), replace(_wide(), **bad))


def test_chunked_matches_torch_under_every_policy():
    variants = [{"trans_b": True, "rope": 128}, {"trans_b": True, "bias": True, "rope": 128},
                {"dtype": "fp16", "out_dtype": "f32", "rope": 128}]
    for seed, kw in enumerate(variants):  # ragged M and K, N whole heads (half a tile too), periods of whole tiles
        before = build(GemmRequest(1, 1, 1, **kw), _wide())
        assert_matches_reference(before, pipeline.run(before, verify=True), seed, nprog=2 + seed % 2)


def test_chunked_mutated_sign_is_caught():
    """The second half's x2 cos2 + x1 sin2 with the first half's sign: the interpreter's output differs."""
    after = pipeline.run(build(GemmRequest(1, 1, 1, trans_b=True, rope=128), replace(_wide(), block_k=32)))
    inst = make_instance(after, 1)
    out = run_partitioned(after, inst.inputs(), policy="adversarial", seed=1, nprog=2)
    assert torch.equal(out["c"], inst.reference["c"])
    text = format_program(after)
    bad_text = text.replace("= add(%rc_h0_1", "= sub(%rc_h0_1")
    assert bad_text != text
    bad = run_partitioned(parse_program(bad_text), inst.inputs(), policy="random", seed=0, nprog=2)
    assert not torch.equal(bad["c"], inst.reference["c"])


def test_runtime_wide_config(monkeypatch):
    """runtime.gemm_rope: the wide config serves D = 128 only; the site's race offers it only once GPU-checked, with
    more rows than decode tiles take and tables by TMA; a call with config=None runs the config the site's
    measurement kept; a named wide config whose tables cannot come by TMA is refused with the reason."""
    from torch_autows.runtime import choice, gemm_rope
    from torch_autows.runtime import device as dev

    monkeypatch.setattr(dev, "sm90_reason", lambda device, check_device=True: None)
    assert gemm_rope.serves("rope_p_128x256", 128) and not gemm_rope.serves("rope_p_128x256", 64)
    bf = torch.bfloat16
    a, w = torch.randn(512, 256, dtype=bf), torch.randn(512, 256, dtype=bf)
    cos, sin = torch.randn(256, 128, dtype=bf), torch.randn(256, 128, dtype=bf)
    assert gemm_rope.candidates(512, 512, 256, 128, cos, sin) == ["ws_p_128x128"]
    monkeypatch.setattr(gemm_rope, "WIDE_GPU_CHECKED", True)
    assert gemm_rope.candidates(512, 512, 256, 128, cos, sin) == ["ws_p_128x128", "rope_p_128x256"]
    assert gemm_rope.candidates(64, 512, 256, 128, cos, sin)[1:] == []  # decode rows
    assert gemm_rope.candidates(512, 512, 256, 128, cos[:200], sin[:200])[1:] == []  # P = 200: tiles would wrap
    launched = []
    monkeypatch.setattr(gemm_rope, "launch_template", lambda req, opts, *args: launched.append(opts))
    out = torch.empty(512, 512, dtype=bf)
    gemm_rope.gemm_rope(a, w.t(), cos, sin, config=None, out=out)  # nothing measured: choose_config's
    assert launched[-1].block_n == 128
    key = gemm_rope._site_key(a, w.t(), cos, 512, 512, 256, ["ws_p_128x128", "rope_p_128x256"])
    choice.records[key] = choice.Decision(True, "measured", 1.0, 1.2, 0.01, "rope_p_128x256")
    try:
        gemm_rope._BOUND.clear()
        gemm_rope.gemm_rope(a, w.t(), cos, sin, config=None, out=out)
        assert launched[-1] == replace(gemm_rope.WIDE["rope_p_128x256"], epilogue_tma=True)
    finally:
        choice.records.pop(key)
    with pytest.raises(Unsupported, match="TMA tiles"):
        gemm_rope.gemm_rope(a, w.t(), cos[:200], sin[:200], config="rope_p_128x256", out=out)
