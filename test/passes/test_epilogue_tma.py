"""Epilogue operand tiles by TMA (``Options.epilogue_tma``): the residual R and RoPE's cos/sin loaded by the producer
into SMEM after the tile's K steps and read by the consumer, instead of pointer loads in the consumer.

The template's IR (tensor args, ``load`` ops after the loop, ``smem_read`` + ``cast``; refused with split-K and with
a RoPE tile wider than a head), what the passes make of it (the loads in the producer, per-tile channels, the
store staged in the tile's own slot, SMEM within the limit), the partitioned programs interpreted under every policy
against torch (128x128, the 128x256 and ping-pong tiles for the residual, two tile copies), a table read without the
period caught, offline sm_90a compiles without spills and without global loads, and the runtime's choice of the
transport (``runtime.gemm_rope.tables_options``, ``runtime.gemm_configs.residual_options``) and routing of the operands
(TMA descriptors or pointers as the Program declares them)."""
from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from programs import assert_matches_reference

from torch_autows.codegen.compile import compile_as_launched, summary
from torch_autows.interp import make_instance, run_partitioned
from torch_autows.ir import format_program, parse_program
from torch_autows.passes import pipeline
from torch_autows.runtime import gemm as rt
from torch_autows.templates.gemm import GemmRequest, build


def _et(config: str, **kw):
    return replace(rt.CONFIGS[config], epilogue_tma=True, **kw)


def test_template_ir():
    p = build(GemmRequest(1, 1, 1, trans_b=True, rope=128), _et("ws_p_128x128"))
    assert [(a.name, a.kind) for a in p.args if a.name in ("cos", "sin")] == [("cos", "tensor"), ("sin", "tensor")]
    text = format_program(p)
    loop = text.index("= loop(")
    for t in ("cos", "sin"):
        load = text.index(f"%{t}_tile_s:bf16[128,128]@smem = load() {{arg='{t}', coords=('(pid_m*128)%P', '0')}}")
        assert load > loop
        assert f"%{t}_tile_m:bf16[128,128] = smem_read(%{t}_tile_s)" in text
        assert f"%{t}_tile:f32[128,128] = cast(%{t}_tile_m)" in text
    assert "load_ptr" not in text
    r = build(GemmRequest(1, 1, 1, trans_b=True, residual=True), _et("ws_p_128x256"))
    assert r.arg("r").kind == "tensor"
    assert "%res_s:bf16[128,256]@smem = load() {arg='r', coords=('pid_m*128', 'pid_n*256')}" in format_program(r)
    # the option changes nothing where there is no epilogue operand but the options line
    plain = [format_program(build(GemmRequest(1, 1, 1, trans_b=True), o)).splitlines()
             for o in (rt.CONFIGS["ws_p_128x128"], _et("ws_p_128x128"))]
    assert [a for a, b in zip(*plain) if a != b] == [ln for ln in plain[0] if ln.strip().startswith("options")]


def test_refusals():
    with pytest.raises(ValueError, match="epilogue_tma with split_k > 1"):
        build(GemmRequest(1, 1, 1, trans_b=True, residual=True), _et("dec_128x128_s2"))
    with pytest.raises(ValueError, match="by TMA: of one head"):
        build(GemmRequest(1, 1, 1, trans_b=True, rope=64), _et("ws_p_128x128"))


def test_passes_load_in_the_producer_and_stage_the_store_in_the_slot():
    p = pipeline.run(build(GemmRequest(1, 1, 1, trans_b=True, residual=True), _et("ws_p_128x128")), verify=True)
    loads = [o for o in p.body if o.kind == "load"]
    assert {o.partition for o in loads} == {"producer"} and len(loads) == 2  # one per chain
    assert {o.attr("stage") for o in p.body if o.kind == "store"} == {"res_s_c0", "res_s_c1"}
    assert not any(b.name.startswith("out_") for b in p.buffers)  # no staging tile of its own
    assert {c.src for c in p.channels if c.value.startswith("res_s")} == {"producer"}
    assert p.smem_bytes <= p.arch.smem_limit


CASES = [("ws_p_128x128", {}, {"rope": 128}), ("ws_p_128x128", {}, {"rope": 128, "bias": True}),
         ("ws_p_128x128", {}, {"residual": True}), ("ws_p_128x128", {"tile_buffers": 2}, {"rope": 128}),
         ("ws_p_128x128", {"tile_buffers": 2}, {"residual": True, "bias": True}),
         ("dec_128x128_s1", {}, {"rope": 128}), ("dec_128x128_s1", {}, {"residual": True}),
         ("ws_p_128x256", {}, {"residual": True}), ("ws_pp2_128x128", {}, {"residual": True}),
         ("ws_pp2_128x128", {}, {"dtype": "fp16", "out_dtype": "f32", "residual": True})]


@pytest.mark.parametrize("config,kw,req", CASES, ids=lambda x: str(x))
def test_matches_torch_under_every_policy(config, kw, req):
    before = build(GemmRequest(1, 1, 1, trans_b=True, **req), _et(config, **kw))
    for seed in range(2):  # ragged M, N, K; the tables' period a multiple of the tile's rows or >= M
        assert_matches_reference(before, pipeline.run(before, verify=True), seed, nprog=2 + seed)


def test_a_table_read_without_its_period_is_caught():
    after = pipeline.run(build(GemmRequest(1, 1, 1, trans_b=True, rope=128), _et("ws_p_128x128")))
    inst = next(i for i in (make_instance(after, s) for s in range(20)) if i.scalars["P"] < i.scalars["M"])
    out = run_partitioned(after, inst.inputs(), policy="adversarial", seed=0, nprog=2)
    assert torch.equal(out["c"], inst.reference["c"])
    bad = parse_program(format_program(after).replace("(pid_m*128)%P", "pid_m*128"))
    assert not torch.equal(run_partitioned(bad, inst.inputs(), policy="random", seed=0, nprog=2)["c"],
                           inst.reference["c"])


@pytest.mark.parametrize("config,req", [("ws_p_128x128", {"rope": 128}), ("dec_128x128_s1", {"rope": 128}),
                                        ("ws_p_128x128", {"residual": True}), ("ws_p_128x256", {"residual": True}),
                                        ("ws_pp2_128x128", {"residual": True})])
def test_compiles_without_spills_or_global_loads(config, req):
    program = pipeline.run(build(GemmRequest(4096, 4096, 4096, trans_b=True, **req), _et(config)))
    kernel = compile_as_launched(program)
    s = summary(program, kernel)
    assert s["spills"] == 0 and s["smem_bytes"] <= program.arch.smem_limit
    assert "ld.global" not in kernel.asm["ptx"]  # every epilogue operand comes through SMEM


def test_runtime_transport():
    from torch_autows.runtime.gemm_rope import tables_options

    bf = torch.bfloat16
    cos = torch.empty(2048, 128, dtype=bf)
    opts = rt.CONFIGS["ws_p_128x128"]
    assert tables_options(opts, cos, cos, 16384).epilogue_tma  # P a multiple of the tile's rows
    assert tables_options(opts, cos[:1000], cos[:1000], 1000).epilogue_tma  # P >= M: no row wraps
    assert not tables_options(opts, cos[:1000], cos[:1000], 2000).epilogue_tma  # rows would wrap inside a tile
    assert not tables_options(rt.CONFIGS["dec_128x128_s2"], cos, cos, 64).epilogue_tma  # split-K
    assert not tables_options(opts, cos[:, :64], cos[:, :64], 64).epilogue_tma  # two heads in a tile
    assert not tables_options(rt.CONFIGS["ws_p_128x128_e2"], cos, cos, 64).epilogue_tma  # measured slower
    odd = torch.empty(2048 * 128 + 1, dtype=bf)[1:].view(2048, 128)  # 2-byte aligned
    assert not tables_options(opts, odd, cos, 64).epilogue_tma
    assert rt.residual_options("ws_p_128x256").epilogue_tma  # R by TMA where K is not split
    assert not rt.residual_options("dec_128x128_s2").epilogue_tma  # split-K: pointer loads after the reduction
    assert rt.serves_residual("ws_p_128x256") and not rt.serves_residual("ws_p_128x256", out32=True)


def test_launch_passes_each_operand_as_its_argument_is_declared(monkeypatch):
    """launch_template hands TMA descriptors for "tensor" args and pointers for "ptr" ones: the tables by TMA where
    tables_options allows it, by pointers where their rows would wrap."""
    from torch_autows.runtime import device as dev
    from torch_autows.runtime import gemm_rope
    from torch_autows.runtime.launch import Tma

    seen = []

    class Launcher:
        def ordered(self, values):
            seen.append({n: isinstance(values[n], Tma) for n in ("a", "b", "c", "cos", "sin")})
            return []

        def __call__(self, grid, args, idx):
            pass

        def bind(self, grid, args, idx):
            return None

    monkeypatch.setattr(dev, "sm90_reason", lambda device, check_device=True: None)
    monkeypatch.setattr(rt, "compile_kernel", lambda kind, req, options: SimpleNamespace(
        launcher=Launcher(), program=build(req, options)))
    monkeypatch.setattr(dev, "index", lambda d: 0)
    monkeypatch.setattr(dev, "num_sms", lambda i: 132)
    bf = torch.bfloat16
    a, w = torch.randn(512, 256, dtype=bf), torch.randn(256, 256, dtype=bf)
    cos = torch.randn(256, 128, dtype=bf)
    gemm_rope._BOUND.clear()
    gemm_rope.gemm_rope(a, w.t(), cos, cos.clone(), config="ws_p_128x128")  # P = 256: whole tiles
    gemm_rope.gemm_rope(a, w.t(), cos[:200].contiguous(), cos[:200].contiguous(), config="ws_p_128x128")  # wraps
    gemm_rope._BOUND.clear()
    tma = {"a": True, "b": True, "c": True}
    assert seen == [{**tma, "cos": True, "sin": True}, {**tma, "cos": False, "sin": False}]
