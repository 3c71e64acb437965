"""Q in registers (``Options.q_regs``): the attention forward reads each Q piece from SMEM into registers once a tile
(``smem_read``), and every step's Q K^T takes its A operand from them (wgmma's register-A form), so a step reads only
K from SMEM. The template's IR, the same passes and the interpreter against torch, the Gluon (read straight into
wgmma's A-operand layout, no per-step conversion) and the sm_90a PTX (the register-A wgmma), and the picks."""
from __future__ import annotations

import re
from dataclasses import replace

import pytest

from torch_autows.codegen import gluon
from torch_autows.codegen.compile import compile_as_launched, summary
from torch_autows.interp import POLICIES, make_instance, run_partitioned, run_sequential
from torch_autows.ir import format_program, walk
from torch_autows.passes import pipeline
from torch_autows.runtime.attention import CONFIGS, choose_config, serves
from torch_autows.templates.attention import AttentionRequest, build
from torch_autows.verify import VerifyError, check

QR = [c for c in CONFIGS if CONFIGS[c].q_regs]


def _qk_mmas(program):
    """The Q K^T mmas of a program's body (their B is K transposed)."""
    return [o for o in walk(program.body) if o.kind == "mma" and o.operands[1].startswith("kt")]


def test_template_reads_each_q_piece_once_before_the_loop():
    opts = CONFIGS["ws_p_128x64_rm_g16_sdb_dm_s3_lc_qr"]
    p = build(AttentionRequest(192, "bf16", False, o_tma=True), opts)
    top = [o.kind for o in p.body]
    reads = [o for o in p.body if o.kind == "smem_read"]
    assert [(o.operands[0], o.results[0].name, o.results[0].type.shape) for o in reads] == [
        ("q", "qr", (128, 128)), ("q_p1", "qr_p1", (128, 64))]
    assert top.index("smem_read") < top.index("loop") and all(o.results[0].type.space == "reg" for o in reads)
    assert [o.operands[0] for o in _qk_mmas(p)] == ["qr", "qr_p1"]
    plain = build(AttentionRequest(192, "bf16", False, o_tma=True), replace(opts, q_regs=False))
    assert [o.operands[0] for o in _qk_mmas(plain)] == ["q", "q_p1"]
    assert "smem_read" not in format_program(plain)


@pytest.mark.parametrize("config,d,causal,o_tma", [
    ("ws_p_128x128_q2_rm_g16_qr", 64, True, False), ("ws_p_128x128_q2_rm_g16_sdb_qr", 96, False, True),
    ("ws_p_128x64_rm_g16_sdb_dm_s3_lc_qr", 192, True, True),
    ("ws_p_128x64_rm_g16_sdb_dm_s3_lc_q2_qr", 192, False, False)])
def test_matches_torch_under_every_policy(config, d, causal, o_tma):
    before = build(AttentionRequest(d, "bf16", causal, o_tma=o_tma), CONFIGS[config])
    after = pipeline.run(before, verify=True)
    for pt in after.partitions:  # each consumer chain reads its own rows, once a tile
        reads = [o for o in walk(pt.body) if o.kind == "smem_read"]
        assert not reads or all(o.results[0].type.shape[0] == 64 for o in reads), pt.name
    for seed in range(2):
        inst = make_instance(after, seed)
        seq = run_sequential(before, inst.inputs())
        assert inst.matches(seq), (inst.desc, inst.error(seq))
        for policy in POLICIES:
            out = run_partitioned(after, inst.inputs(), policy=policy, seed=seed, nprog=2)
            assert inst.matches(out), (policy, inst.desc, inst.error(out))


def _swap_reads(program):
    """``program`` with chain 0's first two Q pieces' register reads swapped (each Q K^T piece gets the other's Q)."""
    pair = ("q_c0", "q_p1_c0")

    def swap(ops):
        out = []
        for o in ops:
            if o.kind == "smem_read" and o.operands[0] in pair:
                o = replace(o, operands=(pair[1 - pair.index(o.operands[0])],))
            out.append(replace(o, body=swap(o.body)) if o.body else o)
        return tuple(out)
    return replace(program, partitions=tuple(replace(pt, body=swap(pt.body)) for pt in program.partitions))


def test_interpreter_catches_a_q_piece_read_from_the_wrong_slot():
    """Equal pieces (192 = 3 x 64): chain 0 reading piece 1's Q for piece 0 and back is well typed, and wrong."""
    opts = replace(CONFIGS["ws_p_128x64_rm_g16_sd"], q_regs=True)
    before = build(AttentionRequest(192, "bf16", False), opts)
    after = pipeline.run(before, verify=True)
    bad = _swap_reads(after)
    swapped = [(o.operands[0], o.results[0].name) for pt in bad.partitions for o in walk(pt.body)
               if o.kind == "smem_read"]
    assert ("q_p1_c0", "qr_c0") in swapped and ("q_c0", "qr_p1_c0") in swapped
    inst = make_instance(after, 0)
    assert inst.matches(run_partitioned(after, inst.inputs(), policy="round_robin", seed=0, nprog=2))
    assert not inst.matches(run_partitioned(bad, inst.inputs(), policy="round_robin", seed=0, nprog=2))


def test_gluon_reads_q_into_the_a_operand_layout_and_ptx_takes_a_from_registers():
    config = "ws_p_128x128_q2_rm_g16_qr"
    program = pipeline.run(build(AttentionRequest(64, "bf16", False, o_tma=True), CONFIGS[config]))
    src = gluon.generate(program)
    assert "MMA_N128_A: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA_N128, k_width=2)" in src
    assert "v_qr_c0 = v_q_c0.load(MMA_N128_A)" in src
    assert re.search(r"warpgroup_mma\(v_qr_c0, v_kt_c0, ", src)  # no convert_layout: read in the layout wgmma takes
    assert "convert_layout(v_qr" not in src
    kernel = compile_as_launched(program)
    s = summary(program, kernel)
    assert s["spills"] == 0 and not s["wgmma_serialized"] and s["wgmma_waits_injected"] == 0
    # register A: wgmma's first operand is a register list, not a descriptor; Q K^T (n128) and P V (n64) both take it
    ptx = kernel.asm["ptx"]
    rs = re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n(\d+)k16\.f32\.bf16\.bf16\s+\{[^}]*\},\s*\{", ptx)
    assert {"128", "64"} <= set(rs), rs


def test_picks_take_q_in_registers_where_measured():
    assert CONFIGS[choose_config(64, False, 1024)].q_regs and CONFIGS[choose_config(64, True, 4096)].q_regs
    assert CONFIGS[choose_config(96, True, 4096)].q_regs
    assert all(CONFIGS[choose_config(192, c, s)].q_regs for c in (False, True) for s in (1024, 16384))
    # without the mask d=128 and d=64's 192-row tiles too; with it they spill (d=256 spills 992 bytes either way)
    assert all(CONFIGS[choose_config(d, False, s)].q_regs for d in (64, 128) for s in (1024, 4096, 16384))
    assert not any(CONFIGS[choose_config(d, True, s)].q_regs for d in (128, 256) for s in (1024, 8192))
    assert not any(CONFIGS[choose_config(256, False, s)].q_regs for s in (1024, 8192))
    assert not CONFIGS[choose_config(64, True, 16384)].q_regs
    assert QR and all(not serves(c, 128) and not serves(c, 256) and not serves(c, 256, causal=False) for c in QR)
    assert {c for c in QR if serves(c, 128, causal=False)} == {"ws_p_128x128_q2_rm_g16_qr"}


def _drop_sync(program):
    def strip(ops):
        return tuple(replace(o, attrs=tuple(kv for kv in o.attrs if kv[0] != "sync"), body=strip(o.body))
                     if o.kind == "release" or o.body else o for o in ops)
    return replace(program, partitions=tuple(replace(pt, body=strip(pt.body)) for pt in program.partitions))


def test_the_q_slot_is_released_after_every_thread_read_it():
    """O by pointer: the Q slot's last reader is the register read, so its release waits for the partition's threads
    (one thread arrives for all: without the meeting the producer could refill the slot under a lagging warp's
    loads); with O staged in the Q slot the TMA store's wait is the last reader and no meeting is added."""
    config = CONFIGS["ws_p_128x128_q2_rm_g16_qr"]
    p = pipeline.run(build(AttentionRequest(64, "bf16", False), config))
    rel = [o for pt in p.partitions for o in walk(pt.body) if o.kind == "release" and o.attr("sync")]
    assert len(rel) == 2  # one per consumer chain
    src = gluon.generate(p)
    # each thread fences its generic loads against the TMA (async proxy) refill, then the threads meet, then one
    # arrives (without the fence the H200 showed 16-45 wrong rows of 65552 at Sq=4097, Skv=64, where the producer
    # runs two tiles ahead: sweeps/README.md, -q-regs)
    assert src.count("fence_async_shared()  # this thread's generic loads of the slot before TMA (async proxy) "
                     "refills it\n        gl.thread_barrier()  # every thread's loads from the slot are done before "
                     "its release\n        mbarrier.arrive(g1_empty.index(g1_s))") == 2
    with pytest.raises(VerifyError, match="without sync"):
        check(_drop_sync(p), "code_partition")
    staged = pipeline.run(build(AttentionRequest(64, "bf16", False, o_tma=True), config))
    assert not [o for pt in staged.partitions for o in walk(pt.body) if o.kind == "release" and o.attr("sync")]
