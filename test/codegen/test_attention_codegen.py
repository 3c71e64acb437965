"""Every attention config the runtime can pick compiles offline to sm_90a with the WS structure asserted, for
every head dim it serves (64, 96, 128, 192, 256; 96 and 192 padded or in pieces, ``split_d``), without register spills
(one known case, bounded: ``_SPILLS``)."""
from __future__ import annotations

import itertools
import re

import pytest
from programs import assert_in_order

from torch_autows.codegen import gluon
from torch_autows.codegen.compile import compile_offline, summary
from torch_autows.passes import pipeline
from torch_autows.runtime.attention import CONFIGS, choose_config, serves
from torch_autows.templates.attention import AttentionRequest, build

# 64 and 128 under every config and dtype; the dims in tiles wider than D (96 in 128 columns, 192 and 256 in 256:
# templates.attention.tile_d) in bf16 (fp16 allocates the same registers), 96 padded under the d=128 pick (it
# differs from 128 only in the output's column mask) and under every config running it in pieces (split_d, the pick),
# 192 and 256 under every config serving them
_WIDE = [(c, d, causal, "bf16") for c, d, causal in itertools.product(CONFIGS, (96, 192, 256), (False, True))
         if serves(c, d, causal=causal) and (d != 96 or c == "ws_p_128x128_q2_rm_g16" or CONFIGS[c].split_d)]


# Known spills (bytes, ptxas -v at sm_90a) a case may not exceed. ws_p_128x128_q2_rm_g16_xt at d=128, not causal: two
# scalars (cdiv(Sq, 128)'s Sq+127 and Skv-128) that llc hoists above the warp dispatch, so they live through every
# partition (the 24-register producer's included); ptxas stores them once and reloads them in the consumers' loops.
# The 128-column configs without a mask (d=128, and d=96 in those tiles): 20 bytes since the epilogue normalises by a
# reciprocal a row (one register of the tile walk's scalars stored once and reloaded; the runtime's compile: none).
_SPILLS = {("ws_p_128x128_q2_rm_g16_xt", 128, False): 28,
           **{(c, 128, False): 20 for c in ("ws_p_128x128", "ws_p_128x128_q2", "ws_p_128x128_q2_rm",
                                            "ws_p_128x128_q2_rm_g16", "ws_p_128x128_q2_pp",
                                            "ws_p_128x128_q2_rm_g16_pp")},
           ("ws_p_128x128_q2_rm_g16", 96, False): 20, ("ws_p_128x128_q2_rm_g16_sdb_qr", 96, False): 20,
           ("ws_p_128x128_q2_rm_g16_qr", 128, False): 28,
           # Q in registers (q_regs) at d=192, O stored by pointer: as above, scalars of the walk (as launched: none)
           ("ws_p_128x64_rm_g16_sdb_dm_s3_lc_qr", 192, False): 32, ("ws_p_128x64_rm_g16_sdb_dm_s3_lc_qr", 192, True): 8,
           # d=256 deferred, without the mask and O stored by pointer: 8 bytes (the runtime's compile and the o_tma
           # form, which whole query tiles take: none)
           ("ws_p_128x64_rm_g16_dm_s3", 256, False): 8}
# store_in_ring changes only the TMA store's form (o_tma): by pointer a config is its base's program
_SPILLS.update({(c + "_sr", d, causal): n for (c, d, causal), n in list(_SPILLS.items()) if c + "_sr" in CONFIGS})


@pytest.mark.parametrize("config,d,causal,dtype", [c for c in itertools.product(
    CONFIGS, (64, 128), (False, True), ("bf16", "fp16")) if serves(c[0], c[1], causal=c[2])] + _WIDE)
def test_compiles_with_three_partitions(config, d, causal, dtype):
    for skv in (1, 4096, 8192, 65536):
        assert choose_config(d, causal, skv) in CONFIGS and serves(choose_config(d, causal, skv), d, causal=causal)
    program = pipeline.run(build(AttentionRequest(d, dtype, causal), CONFIGS[config]))
    kernel = compile_offline(program)
    s = summary(program, kernel)
    n = CONFIGS[config].data_partition  # data-partitioned: a consumer per chain, then the producer
    assert [p["name"] for p in s["partitions"]] == [f"consumer{i}" for i in range(n)] + ["producer"]
    assert s["setmaxnreg"] > 0 and s["wgmma"] > 0
    assert not s["wgmma_serialized"], s["wgmma_serialized"]  # ptxas would wait for every wgmma at its issue
    assert s["wgmma_waits_injected"] == 0  # nor for one here and there (a wait the schedule did not place)
    known = _SPILLS.get((config, d, causal), 0)
    assert s["spills"] <= known, f"{s['spills']} bytes of spills (known: {known})"
    if s["spills"]:
        pytest.xfail(f"{config} spills {s['spills']} bytes at sm_90a (known; see _SPILLS)")
    assert s["smem_bytes"] <= 232448
    ptx = kernel.asm["ptx"]
    assert "ex2.approx" in ptx  # the softmax runs in base 2
    assert re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k16\.f32\.(bf16|f16)\.(bf16|f16)", ptx)
    assert "ttg.warp_specialize" in kernel.asm["ttgir"]


_O_TMA = [(c, d, causal) for c, d, causal in itertools.product(CONFIGS, (64, 96, 128, 192, 256), (False, True))
          if serves(c, d, causal=causal) and not CONFIGS[c].cross_tile and (d in (64, 128, 256) or CONFIGS[c].split_d)]


@pytest.mark.parametrize("config,d,causal", _O_TMA)
def test_o_tma_compiles_and_stores_by_tma(config, d, causal):
    """The whole-tile form (``o_tma``: O stored by TMA from the consumer's Q slot) of every config that takes it."""
    program = pipeline.run(build(AttentionRequest(d, "bf16", causal, o_tma=True), CONFIGS[config]))
    kernel = compile_offline(program)
    s = summary(program, kernel)
    known = _SPILLS.get((config, d, causal), 0)
    assert s["spills"] <= known, f"{s['spills']} bytes of spills (known: {known})"
    assert s["smem_bytes"] <= 232448 and s["wgmma"] > 0 and not s["wgmma_serialized"]
    assert s["wgmma_waits_injected"] == 0
    ptx = kernel.asm["ptx"]
    assert re.search(r"cp\.async\.bulk\.tensor\.2d\.global\.shared::cta", ptx)  # the O store
    assert "cp.async.bulk.wait_group.read" in ptx  # its wait before the Q slot goes back to the producer


@pytest.mark.parametrize("config,d,causal", sorted(_SPILLS))
def test_known_spills_are_gone_as_the_runtime_compiles(config, d, causal):
    """A case in ``_SPILLS`` compiled as the runtime's launch compiles a typical call (Triton specialises integer
    arguments divisible by 16 and 16-byte aligned pointers; the group size G left open): no spills."""
    from torch_autows.codegen.compile import compile_as_launched, ptxas_info

    program = pipeline.run(build(AttentionRequest(d, "bf16", causal), CONFIGS[config]))
    kernel = compile_as_launched(program)
    assert ptxas_info(kernel.asm["ptx"], program.arch)["spills"] == 0

def test_generated_attention_source_in_order():
    program = pipeline.run(build(AttentionRequest(128, "bf16", True), CONFIGS["ws_p_128x128_q2"]))
    src = gluon.generate(program)
    ordered = ["def consumer0(", "num_pid_m = gl.cdiv(Sq, 128)", "pid_m = first",
               "gl.full([64], float(\"-inf\"), gl.float32",
               "mbarrier.wait(g1_ready.index(g1_s), (g1_n // 2) & 1)",  # Q once per tile (2 copies), before the loop
               # prologue: step 0's Q K^T and softmax
               "v_s_c0_pro = warpgroup_mma(", "v_s_c0_pro = warpgroup_mma_wait(num_outstanding=0",
               "if (0 * 128 + 128 > Skv) | (0 * 128 + 127 > (gl.cdiv(Sq, 128) - 1 - pid_m) * 128):",
               "v_p16_c0_pro = v_p_c0_pro.to(gl.bfloat16)",
               "for j in range(1, min(gl.cdiv(Skv, 128), gl.cdiv((gl.cdiv(Sq, 128) - 1 - pid_m) * 128 + 128, 128))):",
               "mbarrier.wait(g0_ready.index(g0_s), (g0_n // 2) & 1)",  # K: its own ring, 2 deep
               # step j's Q K^T and step j-1's P V issued back to back, then Q K^T retired alone
               "v_s_c0 = warpgroup_mma(v_q_c0, v_kt_c0, gl.zeros([64, 128], gl.float32, MMA_N128), use_acc=False, "
               "is_async=True)\n",
               "v_v_prev = v_smem.index((g2_n + 2) % 3)",  # V: a ring one deeper, read a step late
               "v_acc_new_c0 = warpgroup_mma(gl.convert_layout(v_p16_c0_prev",
               "v_s_c0_r = warpgroup_mma_wait(num_outstanding=1, deps=(v_s_c0,))",
               "mbarrier.arrive(g0_empty.index(g0_s))", "g0_n += 1",  # K's slot freed once Q K^T retires
               "gl.where(gl.arange(0, 128, layout=MMA_N128_S0)[None, :] < v_s_m_c0_lim[:, None]",  # causal mask
               "gl.max(v_s_m_c0, axis=1)", "gl.exp2(",
               "mbarrier.wait(g2_ready.index(g2_s), (g2_n // 3) & 1)",
               "v_acc_new_c0_done, _ = warpgroup_mma_wait(num_outstanding=0, deps=(v_acc_new_c0, v_p16_c0_prev))",
               "mbarrier.arrive(g2_empty.index((g2_n + 2) % 3))", "g2_n += 1",
               # epilogue: the last step's P V, then its slot and Q are released
               "v_v_epi = v_smem.index((g2_n + 2) % 3)", "v_acc_f_c0 = warpgroup_mma(",
               "mbarrier.arrive(g2_empty.index((g2_n + 2) % 3))",
               "mbarrier.arrive(g1_empty.index(g1_s))",
               "v_out_c0_p = o_ptr + ", "gl.store(v_out_c0_p", "gl.store(lse_ptr",
               "def producer(", "tma.async_copy_global_to_shared(q_desc", "for j in range(",
               "tma.async_copy_global_to_shared(k_desc", "tma.async_copy_global_to_shared(v_desc",
               "gl.warp_specialize("]
    assert_in_order(src, ordered)


@pytest.mark.parametrize("causal", (False, True))
def test_mask_guard_is_exact(causal):
    """The emitted guard skips the mask only on blocks where it would keep every score."""
    import math
    import random
    from types import SimpleNamespace

    from torch_autows.codegen.emitters import mask_guard
    from torch_autows.ir import walk

    program = pipeline.run(build(AttentionRequest(128, "bf16", causal), CONFIGS["ws_p_128x128"]))
    masks = [o for o in walk(program.body) if o.kind == "mask"]
    assert len(masks) == 2  # one per chain
    src = gluon.generate(program)
    rng = random.Random(0)
    gl_ns = SimpleNamespace(cdiv=lambda a, b: -(-a // b))
    skipped = 0
    for o in masks:
        bm, bn = o.results[0].type.shape
        guard = mask_guard(o, bm, bn)
        assert f"if {guard}:" in src
        for _ in range(400):
            sq, skv = rng.randint(1, 700), rng.randint(1, 700)
            env = {"gl": gl_ns, "min": min, "Sq": sq, "Skv": skv, "pid_m": rng.randrange(math.ceil(sq / 128)),
                   "j": rng.randrange(math.ceil(skv / bn)), "pid_bh": 0}
            row0 = eval(gluon.expr(o.attr("row")), env)
            col0 = eval(gluon.expr(o.attr("col")), env)
            changes = any(c >= skv or (causal and c > r)
                          for r in range(row0, row0 + bm) for c in range(col0, col0 + bn))
            if changes:
                assert eval(guard, env), (guard, env)
            skipped += not eval(guard, env)
    assert skipped > 100  # interior blocks do skip the mask


def test_turn_barriers_come_from_the_ir():
    """codegen allocates and names the ping-pong turn barriers from Program.turns (passes/ping_pong), not by
    finding turn ops: the record's name and count are what the kernel allocates and the partitions use."""
    from dataclasses import replace

    program = pipeline.run(build(AttentionRequest(128, "bf16", False), CONFIGS["ws_p_128x128_q2_pp"]))
    assert program.turns is not None and program.turns.count == 2
    src = gluon.generate(replace(program, turns=replace(program.turns, name="turns_x")))
    assert "turn_bar" not in src
    assert "turns_x = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())" in src
    assert "mbarrier.wait(turns_x.index(1), (turn_n & 1))" in src and "mbarrier.arrive(turns_x.index(0))" in src
    with pytest.raises(ValueError, match="Program.turns"):
        gluon.generate(replace(program, turns=None))


def test_wide_tiles_store_only_the_head_dims_columns():
    """d=96 runs in 128-column tiles: the output store masks columns from 96 on and rows are 96 apart; d=128 stores
    its whole tile (no column mask: its Gluon is unchanged). (The runtime picks column pieces for d=96: split_d.)"""
    config = CONFIGS["ws_p_128x128_q2_rm_g16"]
    src96 = gluon.generate(pipeline.run(build(AttentionRequest(96, "bf16", False), config)))
    src128 = gluon.generate(pipeline.run(build(AttentionRequest(128, "bf16", False), config)))
    assert "gl.zeros([64, 128], gl.float32" in src96  # the accumulator is 128 wide
    assert "_c < 96)[None, :])" in src96 and "* (96 + (Hq - 1) * o_ch))" in src96
    assert "[None, :])" not in src128.split("gl.store(v_out")[1].split("\n")[0]
