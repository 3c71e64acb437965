"""The GPU sweep scripts under bench/results/sweeps/ stay runnable: what they would time is what the runtime serves.
(CPU: no timing; the scripts' own selection logic and the programs of their variants.)"""
from __future__ import annotations

import importlib.util
import pathlib
import sys

import pytest

from torch_autows.passes import pipeline
from torch_autows.runtime import attention_bwd as rt
from torch_autows.runtime import attention_bwd_configs as rt_cfg
from torch_autows.templates.attention_bwd import AttentionBwdRequest, build

SWEEPS = pathlib.Path(__file__).resolve().parents[2] / "bench" / "results" / "sweeps"


def _load(name: str, argv: list[str], monkeypatch):
    monkeypatch.setattr(sys, "argv", [name, *argv])
    spec = importlib.util.spec_from_file_location(f"sweep_{name}", SWEEPS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def restored(monkeypatch):
    """The runtime's config tables as they were after the test (the script adds its variants to them)."""
    for table in ("CONFIGS", "CONFIG_HEAD_DIMS", "DQ_CONFIGS", "DQ_CONFIG_HEAD_DIMS"):
        copy = dict(getattr(rt_cfg, table))  # the configs module reads its own; runtime.attention_bwd re-exports
        monkeypatch.setattr(rt_cfg, table, copy)
        monkeypatch.setattr(rt, table, copy)
    return monkeypatch


def test_attention_bwd_configs_times_only_what_serves(restored):
    """Every combo the backward config sweep would time is a (form, config, dQ config) the runtime serves at that head
    dim (after the script's variants join the tables); every variant builds through the passes at its head dims; the
    regex filter keeps only its matches."""
    mod = _load("attention_bwd_configs", ["out.json"], restored)
    mod.add_variants()
    for d in (64, 128):
        combos = list(mod.combos(d))
        assert combos
        for mode, c, dc in combos:
            assert rt.serves(c, d, mode), (mode, c, d)
            assert (dc is None) == (mode != "separate") and (dc is None or rt.dq_serves(dc, d))
    for name in mod.VARIANTS:
        for form, dims in rt.CONFIG_HEAD_DIMS[name].items():
            for d in dims:
                dq = "none" if form == "separate" else form
                pipeline.run(build(AttentionBwdRequest(d, "bf16", True, dq=dq), rt.CONFIGS[name]))
    only = _load("attention_bwd_configs", ["out.json", "^reduce:bwd_64x128_dp2_p:"], restored)
    assert [c for c in only.combos(64)] == [("reduce", "bwd_64x128_dp2_p", None)]


def test_attention_ablate_patches_what_it_names(restored):
    """The ablation script's variants build through the passes, and its ``nored``/``nosync`` patches still match the
    split-dQ kernel's source (the reduce-add and the consumers' meeting); a patch that matches nothing is reported
    (``Unpatched``), not timed as if it had applied (``novec``: the main kernel reads lse2/delta by TMA now). The
    forward's ``ooff``/``lseoff`` predicate the pointer stores off and keep them (so nothing upstream is dead code)."""
    from torch_autows.codegen import gluon
    from torch_autows.runtime import attention as fa
    from torch_autows.templates.attention import AttentionRequest
    from torch_autows.templates.attention import build as build_fwd

    mod = _load("attention_ablate", ["out.json"], restored)
    mod.add_variants()
    assert mod.VARIANTS and all(rt.serves(n, d, m) for n, m, dims in mod.VARIANTS for d in dims)
    split = gluon.generate(pipeline.run(build(AttentionBwdRequest(128, "bf16", False, dq="reduce"),
                                              rt.CONFIGS["split"])))
    for patch in (mod.nored, mod.nosync):
        assert patch(split) != split
    assert "async_reduce_add_shared_to_global(dq_acc_desc" not in mod.nored(split)
    assert "mbarrier.arrive(dss_meet" not in mod.nosync(split)
    assert mod.novec(split) == split
    mod.add("split_novec", "reduce", "bwd_64x128_dp2_dqsplit_fold", (mod.novec,), (128,))
    program = pipeline.run(build(AttentionBwdRequest(128, "bf16", False, dq="reduce"), rt.CONFIGS["split_novec"]))
    with pytest.raises(mod.Unpatched, match="novec"):
        mod.generate(program)
    for table in ("CONFIGS", "HEAD_DIMS"):
        restored.setattr(fa, table, dict(getattr(fa, table)))
    mod.add_fwd_variants()
    fwd = mod.generate(pipeline.run(build_fwd(AttentionRequest(128, "bf16", False), fa.CONFIGS["fwd_ooff_lseoff"])))
    assert fwd.count("gl.store(v_out_c") == 2 and fwd.count("& (qk_scale < 0.0))") == 4


def test_attention_ablate_tile_turn_patches_match(restored):
    """``--fwd-tile``: every variant builds (O by TMA, as the probe's whole tiles run) and each of its patches changes
    the source; ``earlyq`` moves the Q slot's release to the key loop's end (on the O-in-V config it is a correct
    program: O no longer stages in that slot)."""
    from torch_autows.runtime import attention as fa
    from torch_autows.templates.attention import AttentionRequest
    from torch_autows.templates.attention import build as build_fwd

    mod = _load("attention_ablate", ["out.json"], restored)
    for table in ("CONFIGS", "HEAD_DIMS"):
        restored.setattr(fa, table, dict(getattr(fa, table)))
    mod.add_tile_variants()
    for name, _, patches, d in mod.TILE:
        src = mod.generate(pipeline.run(build_fwd(AttentionRequest(d, "bf16", True, o_tma=True), fa.CONFIGS[name])))
        if mod.earlyq in patches:
            loop_end = src.index("v_m_f_c0 = v_m_c0")
            assert src.index("mbarrier.arrive(g1_empty.index(g1_s))") == src.index("\n", loop_end) + 9, name


def test_attention_configs_variants_build_at_their_head_dims(monkeypatch):
    """Every named forward variant of the config sweep joins the runtime's tables and builds through the passes at
    each head dim it serves (the script skips none by accident and times nothing that cannot build)."""
    from torch_autows.runtime import attention as rta
    from torch_autows.templates.attention import AttentionRequest
    from torch_autows.templates.attention import build as build_fwd

    for table in ("CONFIGS", "HEAD_DIMS"):
        monkeypatch.setattr(rta, table, dict(getattr(rta, table)))
    mod = _load("attention_configs", [], monkeypatch)
    mod.add_variants()
    for name in mod.VARIANTS:
        dims = rta.HEAD_DIMS.get(name, ())
        assert dims, name
        for d in dims:
            pipeline.run(build_fwd(AttentionRequest(d, "bf16", True), rta.CONFIGS[name]))
