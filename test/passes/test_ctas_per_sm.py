"""Options.ctas_per_sm: several persistent CTAs resident on one SM (short causal attention's picks).

The SMEM plan fits the CTA's share, the partitions' registers fit what the launch's register cap gives the CTA (a
setmaxnreg asking for more than the CTA holds would wait forever), the compile carries that cap, the Triton-emitted
setmaxnreg agree with the partitions, and the persistent grid has that many CTAs per SM.
"""
from __future__ import annotations

import re
from dataclasses import replace

import pytest

from torch_autows.codegen.compile import compile_offline, compile_options
from torch_autows.ir import SM90
from torch_autows.passes import pipeline
from torch_autows.runtime import device as dev
from torch_autows.runtime.attention import CONFIGS, choose_config, serves
from torch_autows.templates.attention import AttentionRequest, build

_MULTI = [c for c in CONFIGS if CONFIGS[c].ctas_per_sm > 1]


def test_arch_shares():
    assert SM90.smem_per_cta(1) == SM90.smem_limit == 232448
    assert SM90.smem_per_cta(2) == (232448 + 1024) // 2 - 1024 == 115712
    assert SM90.smem_per_cta(3) == 76800
    assert SM90.regs_per_thread(2, 256) == 128 and SM90.regs_per_thread(3, 256) == 80
    assert SM90.regs_per_thread(1, 128) == 256  # capped at setmaxnreg's most


def test_multi_cta_configs_exist():
    assert {CONFIGS[c].ctas_per_sm for c in _MULTI} == {2, 3}


@pytest.mark.parametrize("config", _MULTI)
@pytest.mark.parametrize("causal", [False, True])
def test_plan_fits_the_cta_share(config, causal):
    opts = CONFIGS[config]
    for d in (64, 128):
        if not serves(config, d):
            continue
        p = pipeline.run(build(AttentionRequest(d, "bf16", causal, o_tma=True), opts))
        n = opts.ctas_per_sm
        assert p.smem_bytes <= SM90.smem_per_cta(n)
        threads = SM90.cta_threads(pt.warps for pt in p.partitions)
        assert threads == 128 * len(p.partitions)  # one consumer warpgroup and the producer's (one warp, padded)
        cap = compile_options(p)["maxnreg"]
        assert cap == SM90.regs_per_thread(n, threads)
        assert sum(128 * pt.regs for pt in p.partitions) <= cap * threads  # setmaxnreg stays within the CTA
        assert n * cap * threads <= SM90.regs_per_sm


def test_one_cta_compiles_without_a_cap():
    p = pipeline.run(build(AttentionRequest(128, "bf16", True), CONFIGS["ws_p_128x128_q2_rm_g16"]))
    assert compile_options(p) == {"num_warps": 4}


@pytest.mark.parametrize("config", _MULTI)
def test_setmaxnreg_matches_the_partitions(config):
    """Triton derives the setmaxnreg values from the cap and the producer's registers: the same as the partitions'."""
    p = pipeline.run(build(AttentionRequest(64, "bf16", True, o_tma=True), CONFIGS[config]))
    ptx = compile_offline(p).asm["ptx"]
    assert re.search(r"\.maxnreg (\d+)", ptx).group(1) == str(compile_options(p)["maxnreg"])
    incs = {int(v) for v in re.findall(r"setmaxnreg\.inc\.sync\.aligned\.u32\s+(\d+);", ptx)}
    decs = {int(v) for v in re.findall(r"setmaxnreg\.dec\.sync\.aligned\.u32\s+(\d+);", ptx)}
    consumer, producer = p.partitions[0].regs, p.partitions[-1].regs
    assert consumer in incs and producer in decs and max(incs) == consumer


def test_more_ctas_than_fit_is_refused():
    """Three CTAs of d=128's 64x128 tiles: no ring depth fits 75 KB, a PassError says so."""
    from torch_autows.passes import PassError

    opts = replace(CONFIGS["ws_p_64x64_q2_rm_g16_c2"], block_n=128, ctas_per_sm=3)
    with pytest.raises(PassError, match="exceeds 76800 B"):
        pipeline.run(build(AttentionRequest(128, "bf16", True), opts))


def test_grid_has_n_ctas_an_sm(monkeypatch):
    monkeypatch.setattr(dev, "num_sms", lambda idx: 132)
    assert dev.grid(10_000, True, 0) == 132
    assert dev.grid(10_000, True, 0, 3) == 396
    assert dev.grid(200, True, 0, 3) == 200
    assert dev.grid(10_000, False, 0, 3) == 10_000


def test_short_causal_picks():
    assert CONFIGS[choose_config(64, True, 512)].ctas_per_sm == 3
    assert CONFIGS[choose_config(128, True, 512)].ctas_per_sm == 2
    for d, causal, skv in [(64, True, 1024), (128, True, 1024), (64, False, 512), (128, False, 512), (96, True, 512)]:
        assert CONFIGS[choose_config(d, causal, skv)].ctas_per_sm == 1, (d, causal, skv)
    assert choose_config(192, True, 1024) == choose_config(192, False, 1024) == "ws_p_128x64_rm_g16_sdb_dm_s3_lc_q2_qr"
    assert choose_config(192, True, 4096) == choose_config(192, False, 1025) == "ws_p_128x64_rm_g16_sdb_dm_s3_lc_qr"
