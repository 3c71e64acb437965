"""Before/after IR of each pass on a small GEMM (two chains, persistent), plus PassError cases."""
from __future__ import annotations

from dataclasses import replace

import expecttest
import pytest
from programs import SMALL, small_gemm

from torch_autows.ir import format_program, parse_program
from torch_autows.passes import (
    PassError,
    buffers,
    data_partition,
    loop_schedule,
    memory_plan,
    partition_schedule,
    pipeline,
)
from torch_autows.verify import VerifyError


def _lines(p, *prefixes):
    text = format_program(p)
    return "\n".join(ln for ln in text.splitlines() if ln.strip().startswith(prefixes)) + "\n"


def _body(p):
    text = format_program(p)
    return text[text.index("  body {"):text.index("\n  }\n") + 4]


def _upto(name):
    p = small_gemm()
    for step, fn in pipeline.PIPELINE:
        if step == name:
            return p, fn
        p = fn(p, None)
    raise KeyError(name)


class TestPasses(expecttest.TestCase):
    def test_template(self):
        self.assertExpectedInline(format_program(small_gemm(bias=True)), """\
program gemm_bf16_nn_128x64x32_bias
  arch sm90 sm=90 smem_limit=232448 regs_per_sm=65536 max_regs_per_thread=256 min_regs_per_thread=24 reg_granularity=8 mma=wgmma mma_rows=64
  template gemm
  arg a: tensor<bf16>[M, K]
  arg b: tensor<bf16>[K, N]
  arg c: tensor<bf16>[M, N] out
  arg bias: ptr<bf16>[N]
  arg M: i32
  arg N: i32
  arg K: i32
  grid (pid_m: cdiv(M,128), pid_n: cdiv(N,64)) persistent=True group=8
  options block_m=128 block_n=64 block_k=32 stages=3 data_partition=2 persistent=True group_m=8 mma_pending=1 store_buffers=1 tile_buffers=1 skip_mask=True defer_mma=False pingpong=False raw_max=False serpentine=False producer_warps=1 producer_regs=40
  body {
    %acc0:f32[128,64] = zeros()
    %acc_out:f32[128,64] = loop(%acc0) {iter_args=('acc',), lb=0, ub='cdiv(K,32)', var='k'} {
      %a:bf16[128,32]@smem = load() {arg='a', coords=('pid_m*128', 'k*32')}
      %b:bf16[32,64]@smem = load() {arg='b', coords=('k*32', 'pid_n*64')}
      %acc_next:f32[128,64] = mma(%a, %b, %acc)
      yield(%acc_next)
    }
    %bias_v:f32[64] = load_vec() {arg='bias', offset='pid_n*64', size='N'}
    %bias_row:f32[1,64] = expand(%bias_v) {axis=0}
    %acc_bias:f32[128,64] = add(%acc_out, %bias_row)
    %out:bf16[128,64] = cast(%acc_bias)
    store(%out) {arg='c', coords=('pid_m*128', 'pid_n*64')}
  }
""")

    def test_data_partition(self):
        before, fn = _upto("data_partition")
        self.assertExpectedInline(_body(fn(before, None)), """\
  body {
    %acc0_c0:f32[64,64] = zeros() [chain=0]
    %acc0_c1:f32[64,64] = zeros() [chain=1]
    %acc_out_c0:f32[64,64], %acc_out_c1:f32[64,64] = loop(%acc0_c0, %acc0_c1) {iter_args=('acc_c0', 'acc_c1'), lb=0, ub='cdiv(K,32)', var='k'} {
      %a_c0:bf16[64,32]@smem = load() {arg='a', coords=('pid_m*128', 'k*32')} [chain=0]
      %a_c1:bf16[64,32]@smem = load() {arg='a', coords=('pid_m*128+64', 'k*32')} [chain=1]
      %b:bf16[32,64]@smem = load() {arg='b', coords=('k*32', 'pid_n*64')}
      %acc_next_c0:f32[64,64] = mma(%a_c0, %b, %acc_c0) [chain=0]
      %acc_next_c1:f32[64,64] = mma(%a_c1, %b, %acc_c1) [chain=1]
      yield(%acc_next_c0, %acc_next_c1)
    }
    %out_c0:bf16[64,64] = cast(%acc_out_c0) [chain=0]
    %out_c1:bf16[64,64] = cast(%acc_out_c1) [chain=1]
    store(%out_c0) {arg='c', coords=('pid_m*128', 'pid_n*64')} [chain=0]
    store(%out_c1) {arg='c', coords=('pid_m*128+64', 'pid_n*64')} [chain=1]
  }""")

    def test_loop_schedule(self):
        before, fn = _upto("loop_schedule")
        self.assertExpectedInline(_body(fn(before, None)), """\
  body {
    %acc0_c0:f32[64,64] = zeros() [chain=0]
    %acc0_c1:f32[64,64] = zeros() [chain=1]
    %acc_out_c0:f32[64,64], %acc_out_c1:f32[64,64] = loop(%acc0_c0, %acc0_c1) {iter_args=('acc_c0', 'acc_c1'), lb=0, ub='cdiv(K,32)', var='k'} {
      %a_c0:bf16[64,32]@smem = load() {arg='a', coords=('pid_m*128', 'k*32')} [chain=0 stage=0 order=0]
      %a_c1:bf16[64,32]@smem = load() {arg='a', coords=('pid_m*128+64', 'k*32')} [chain=1 stage=0 order=1]
      %b:bf16[32,64]@smem = load() {arg='b', coords=('k*32', 'pid_n*64')} [stage=0 order=2]
      %acc_next_c0:f32[64,64] = mma(%a_c0, %b, %acc_c0) {pending=1} [chain=0 stage=1 order=3]
      %acc_next_c1:f32[64,64] = mma(%a_c1, %b, %acc_c1) {pending=1} [chain=1 stage=1 order=4]
      yield(%acc_next_c0, %acc_next_c1)
    }
    %out_c0:bf16[64,64] = cast(%acc_out_c0) [chain=0]
    %out_c1:bf16[64,64] = cast(%acc_out_c1) [chain=1]
    store(%out_c0) {arg='c', coords=('pid_m*128', 'pid_n*64')} [chain=0]
    store(%out_c1) {arg='c', coords=('pid_m*128+64', 'pid_n*64')} [chain=1]
  }""")

    def test_partition_schedule(self):
        before, fn = _upto("partition_schedule")
        after = fn(before, None)
        self.assertExpectedInline(_lines(after, "partition") + _body(after), """\
  partition consumer0 warps=4 regs=232
  partition consumer1 warps=4 regs=232
  partition producer warps=1 regs=40
  body {
    %acc0_c0:f32[64,64] = zeros() [chain=0 partition=consumer0]
    %acc0_c1:f32[64,64] = zeros() [chain=1 partition=consumer1]
    %acc_out_c0:f32[64,64], %acc_out_c1:f32[64,64] = loop(%acc0_c0, %acc0_c1) {iter_args=('acc_c0', 'acc_c1'), lb=0, ub='cdiv(K,32)', var='k'} {
      %a_c0:bf16[64,32]@smem = load() {arg='a', coords=('pid_m*128', 'k*32')} [chain=0 partition=producer stage=0 order=0]
      %a_c1:bf16[64,32]@smem = load() {arg='a', coords=('pid_m*128+64', 'k*32')} [chain=1 partition=producer stage=0 order=1]
      %b:bf16[32,64]@smem = load() {arg='b', coords=('k*32', 'pid_n*64')} [partition=producer stage=0 order=2]
      %acc_next_c0:f32[64,64] = mma(%a_c0, %b, %acc_c0) {pending=1} [chain=0 partition=consumer0 stage=1 order=3]
      %acc_next_c1:f32[64,64] = mma(%a_c1, %b, %acc_c1) {pending=1} [chain=1 partition=consumer1 stage=1 order=4]
      yield(%acc_next_c0, %acc_next_c1)
    }
    %out_c0:bf16[64,64] = cast(%acc_out_c0) [chain=0 partition=consumer0]
    %out_c1:bf16[64,64] = cast(%acc_out_c1) [chain=1 partition=consumer1]
    store(%out_c0) {arg='c', coords=('pid_m*128', 'pid_n*64')} [chain=0 partition=consumer0]
    store(%out_c1) {arg='c', coords=('pid_m*128+64', 'pid_n*64')} [chain=1 partition=consumer1]
  }""")

    def test_buffers(self):
        before, fn = _upto("buffers")
        self.assertExpectedInline(_lines(fn(before, None), "buffer", "channel"), """\
  buffer a_c0_smem: bf16[64,32]@smem value=%a_c0 count=None offset=None
  buffer a_c1_smem: bf16[64,32]@smem value=%a_c1 count=None offset=None
  buffer b_smem: bf16[32,64]@smem value=%b count=None offset=None
  buffer out_c0_stage: bf16[64,64]@smem value=%out_c0 count=None offset=None
  buffer out_c1_stage: bf16[64,64]@smem value=%out_c1 count=None offset=None
  channel ch_a_c0: %a_c0 producer -> consumer0 buffer=a_c0_smem group=None
  channel ch_a_c1: %a_c1 producer -> consumer1 buffer=a_c1_smem group=None
  channel ch_b: %b producer -> consumer0,consumer1 buffer=b_smem group=None
""")

    def test_memory_plan(self):
        before, fn = _upto("memory_plan")
        self.assertExpectedInline(_lines(fn(before, None), "buffer", "smem", "note"), """\
  buffer a_c0_smem: bf16[64,32]@smem value=%a_c0 count=3 offset=0
  buffer a_c1_smem: bf16[64,32]@smem value=%a_c1 count=3 offset=12288
  buffer b_smem: bf16[32,64]@smem value=%b count=3 offset=24576
  buffer out_c0_stage: bf16[64,64]@smem value=%out_c0 count=1 offset=36864
  buffer out_c1_stage: bf16[64,64]@smem value=%out_c1 count=1 offset=45056
  smem 53296
""")

    def test_memory_plan_reuses_ring_for_epilogue_when_not_persistent(self):
        p = small_gemm(options=replace(SMALL, persistent=False, data_partition=1))
        for _step, fn in pipeline.PIPELINE[:5]:
            p = fn(p, None)
        self.assertExpectedInline(_lines(p, "buffer", "smem"), """\
  buffer a_smem: bf16[128,32]@smem value=%a count=3 offset=0
  buffer b_smem: bf16[32,64]@smem value=%b count=3 offset=24576
  buffer out_stage: bf16[128,64]@smem value=%out count=1 offset=0
  smem 36912
""")

    def test_code_partition(self):
        before, fn = _upto("code_partition")
        after = fn(before, None)
        text = format_program(after)
        self.assertExpectedInline(_lines(after, "barriers") + text[text.index("  code consumer0"):], """\
  barriers g0: count=3 arrivals=2 bytes=12288 channels=ch_a_c0,ch_a_c1,ch_b
  code consumer0 {
    %acc0_c0:f32[64,64] = zeros() [chain=0 partition=consumer0]
    %acc_out_c0:f32[64,64] = loop(%acc0_c0) {iter_args=('acc_c0',), lb=0, ub='cdiv(K,32)', var='k'} {
      wait_ready() {group='g0'}
      %a_c0:bf16[64,32]@smem = get() {buffer='a_c0_smem', group='g0'}
      %b:bf16[32,64]@smem = get() {buffer='b_smem', group='g0'}
      %acc_next_c0:f32[64,64] = mma(%a_c0, %b, %acc_c0) {pending=1} [chain=0 partition=consumer0 stage=1 order=3]
      release() {group='g0', lag=1}
      advance() {group='g0'}
      yield(%acc_next_c0)
    }
    %acc_out_c0_done:f32[64,64] = mma_wait(%acc_out_c0) {pending=0}
    release_tail() {group='g0', lag=1}
    %out_c0:bf16[64,64] = cast(%acc_out_c0_done) [chain=0 partition=consumer0]
    store(%out_c0) {arg='c', coords=('pid_m*128', 'pid_n*64')} [chain=0 partition=consumer0]
  }
  code consumer1 {
    %acc0_c1:f32[64,64] = zeros() [chain=1 partition=consumer1]
    %acc_out_c1:f32[64,64] = loop(%acc0_c1) {iter_args=('acc_c1',), lb=0, ub='cdiv(K,32)', var='k'} {
      wait_ready() {group='g0'}
      %a_c1:bf16[64,32]@smem = get() {buffer='a_c1_smem', group='g0'}
      %b:bf16[32,64]@smem = get() {buffer='b_smem', group='g0'}
      %acc_next_c1:f32[64,64] = mma(%a_c1, %b, %acc_c1) {pending=1} [chain=1 partition=consumer1 stage=1 order=4]
      release() {group='g0', lag=1}
      advance() {group='g0'}
      yield(%acc_next_c1)
    }
    %acc_out_c1_done:f32[64,64] = mma_wait(%acc_out_c1) {pending=0}
    release_tail() {group='g0', lag=1}
    %out_c1:bf16[64,64] = cast(%acc_out_c1_done) [chain=1 partition=consumer1]
    store(%out_c1) {arg='c', coords=('pid_m*128+64', 'pid_n*64')} [chain=1 partition=consumer1]
  }
  code producer {
    loop() {iter_args=(), lb=0, ub='cdiv(K,32)', var='k'} {
      acquire() {group='g0'}
      %a_c0:bf16[64,32]@smem = load() {arg='a', buffer='a_c0_smem', coords=('pid_m*128', 'k*32'), group='g0'} [chain=0 partition=producer stage=0 order=0]
      %a_c1:bf16[64,32]@smem = load() {arg='a', buffer='a_c1_smem', coords=('pid_m*128+64', 'k*32'), group='g0'} [chain=1 partition=producer stage=0 order=1]
      %b:bf16[32,64]@smem = load() {arg='b', buffer='b_smem', coords=('k*32', 'pid_n*64'), group='g0'} [partition=producer stage=0 order=2]
      advance() {group='g0'}
      yield()
    }
  }
""")


def test_data_partition_factor_one_keeps_names():
    p = data_partition.run(small_gemm(options=replace(SMALL, data_partition=1)))
    assert "_c0" not in format_program(p)
    assert {o.chain for o in p.body if o.kind != "loop"} == {0}


def test_data_partition_rejects_bad_factor():
    with pytest.raises(PassError, match="use 1, 2 or 3"):
        data_partition.run(small_gemm(options=replace(SMALL, data_partition=4)))


def test_partition_schedule_needs_64_rows_per_consumer():
    p = small_gemm(options=replace(SMALL, block_m=64, data_partition=2))
    p = loop_schedule.run(data_partition.run(p))
    with pytest.raises(PassError, match="multiples of 64"):
        partition_schedule.run(p)


def test_partition_schedule_register_budget():
    p = pipeline.run(small_gemm())
    regs = {pt.name: (pt.warps, pt.regs) for pt in p.partitions}
    assert regs == {"consumer0": (4, 232), "consumer1": (4, 232), "producer": (1, 40)}
    assert sum(r * 32 * max(4, w) for w, r in regs.values()) <= 65536


def test_memory_plan_shrinks_then_refuses():
    big = replace(SMALL, block_m=256, block_n=256, block_k=128, stages=4)
    p = small_gemm(options=big)
    for _step, fn in pipeline.PIPELINE[:4]:
        p = fn(p, None)
    with pytest.raises(PassError, match="exceeds"):
        memory_plan.run(p)


def test_memory_plan_shrinks_stages_to_fit():
    p = small_gemm(options=replace(SMALL, block_m=128, block_n=256, block_k=64, stages=6))
    p = pipeline.run(p)
    assert p.smem_bytes <= p.arch.smem_limit
    assert any("ring depth 6 -> 3" in n for n in p.notes)


def test_memory_plan_keeps_enough_slots_for_async_wgmma():
    p = small_gemm(options=replace(SMALL, stages=1))
    p = pipeline.run(p)
    assert {b.count for b in p.buffers if b.name.endswith("_smem")} == {2}  # 1 wgmma in flight + 1


def test_buffers_rejects_register_value_crossing_partitions():
    p = small_gemm()
    for _step, fn in pipeline.PIPELINE[:3]:
        p = fn(p, None)
    text = format_program(p).replace("cast(%acc_out_c0) [chain=0 partition=consumer0]",
                                     "cast(%acc_out_c0) [chain=0 partition=consumer1]")
    with pytest.raises(PassError, match="register value"):
        buffers.run(parse_program(text))


def test_pipeline_dump(tmp_path):
    pipeline.run(small_gemm(), dump_dir=str(tmp_path))
    names = sorted(f.name.split(".", 1)[1] for f in tmp_path.iterdir())
    assert names == ["00.template.ir", "01.data_partition.ir", "02.loop_schedule.ir", "03.partition_schedule.ir",
                     "04.buffers.ir", "05.memory_plan.ir", "06.code_partition.ir", "07.software_pipeline.ir",
                     "08.ping_pong.ir", "09.tile_loop.ir", "10.cross_tile.ir"]


def test_groups_share_one_ring():
    p = pipeline.run(small_gemm(trans_b=True))
    assert len(p.groups) == 1 and p.groups[0].arrivals == 2
    assert all(c.group == "g0" for c in p.channels)



def test_memory_plan_gives_store_staging_its_copies():
    p = pipeline.run(small_gemm(options=replace(SMALL, block_m=128, block_n=128, block_k=64, stages=5,
                                                store_buffers=2)))
    counts = {b.name: b.count for b in p.buffers}
    assert counts["out_c0_stage"] == counts["out_c1_stage"] == 2
    assert {counts[n] for n in ("a_c0_smem", "a_c1_smem", "b_smem")} == {5}
    stages = sorted((b.offset, b.nbytes) for b in p.buffers if b.name.endswith("_stage"))
    assert stages[0][0] + stages[0][1] <= stages[1][0]  # the copies of one chain do not overlap the other's


def test_memory_plan_lowers_ring_then_store_copies():
    # bf16 128x256: two staging copies per chain (128 KB) leave room for a ring of 2
    p = pipeline.run(small_gemm(options=replace(SMALL, block_m=128, block_n=256, block_k=64, stages=4,
                                                store_buffers=2)))
    assert {b.count for b in p.buffers if b.name.endswith("_stage")} == {2}
    assert any("ring depth 4 -> 2" in n for n in p.notes)
    # f32 out: 2 copies of 64x256 f32 per chain (256 KB) cannot fit at all, so the copies drop to 1
    p = pipeline.run(small_gemm(out_dtype="f32", options=replace(SMALL, block_m=128, block_n=256, block_k=64,
                                                                 stages=4, store_buffers=2)))
    assert {b.count for b in p.buffers if b.name.endswith("_stage")} == {1}
    assert any("store staging copies 2 -> 1" in n for n in p.notes)
    assert p.smem_bytes <= p.arch.smem_limit


def test_passes_read_the_programs_arch():
    """SMEM, register file, setmaxnreg step and MMA rows come from ``Program.arch``, not from constants."""
    from torch_autows.ir import SM90

    base = pipeline.run(small_gemm(options=replace(SMALL, block_m=128, block_n=256, block_k=64, stages=4)))
    small = replace(SM90, name="small", smem_limit=base.smem_bytes - 1)
    p = pipeline.run(replace(small_gemm(options=base.options), arch=small))
    assert p.arch == small and p.smem_bytes < base.smem_bytes
    assert any(f"to fit {small.smem_limit} B of SMEM" in n for n in p.notes)
    regs = {pt.name: pt.regs for pt in pipeline.run(replace(small_gemm(), arch=replace(SM90, regs_per_sm=32768))).partitions}
    assert regs == {"consumer0": 104, "consumer1": 104, "producer": 40}  # (32768 - 40*128) // 256 = 108, down to 8s
    with pytest.raises(VerifyError, match="multiples of 16 in 24..256"):  # the producer's 40
        pipeline.run(replace(small_gemm(), arch=replace(SM90, reg_granularity=16)))
    with pytest.raises(PassError, match="wgmma needs multiples of 128"):
        pipeline.run(replace(small_gemm(), arch=replace(SM90, mma_rows=128)))
