"""Tile consumers (``Options.tile_consumers``, CUTLASS's ping-pong over tiles): the partitioned program of one config,
the options the passes refuse with it, and what the verifier catches when its protocol is broken."""
from __future__ import annotations

from dataclasses import replace

import expecttest
import pytest

from torch_autows.ir import Options, format_program, parse_program, walk
from torch_autows.passes import PassError, pipeline
from torch_autows.runtime.gemm import CONFIGS
from torch_autows.templates.gemm import GemmRequest, build
from torch_autows.verify import VerifyError, check

PP = "ws_pp2_128x128"


def _trace(config=PP, **kw) -> dict:
    trace: list = []
    pipeline.run(build(GemmRequest(1, 1, 1, **kw), CONFIGS[config]), trace=trace)
    return dict(trace)


def _lines(p, *prefixes):
    return "\n".join(ln for ln in format_program(p).splitlines() if ln.strip().startswith(prefixes)) + "\n"


def _code(p, part):
    text = format_program(p)
    start = text.index(f"  code {part} {{")
    return text[start:text.index("\n  }\n", start) + 5]


class TestTileConsumers(expecttest.TestCase):
    def test_partitioned_program(self):
        p = _trace()["cross_tile"]
        self.assertExpectedInline(_lines(p, "options", "partition", "buffer", "channel", "barriers", "turns", "smem",
                                         "note"), """\
  options block_m=128 block_n=128 block_k=64 stages=8 data_partition=1 persistent=True group_m=8 mma_pending=1 store_buffers=1 tile_buffers=1 skip_mask=True defer_mma=False pingpong=False raw_max=False serpentine=False producer_warps=1 producer_regs=40 tile_consumers=2
  partition consumer0 warps=4 regs=232 tiles=0/2
  partition consumer1 warps=4 regs=232 tiles=1/2
  partition producer warps=1 regs=40
  buffer a_smem: bf16[128,64]@smem value=%a count=5 offset=0
  buffer b_smem: bf16[64,128]@smem value=%b count=5 offset=81920
  buffer out_c0_stage: bf16[128,128]@smem value=%out_c0 count=1 offset=163840
  buffer out_c1_stage: bf16[128,128]@smem value=%out_c1 count=1 offset=196608
  channel ch_a: %a producer -> consumer0,consumer1 buffer=a_smem group=g0
  channel ch_b: %b producer -> consumer0,consumer1 buffer=b_smem group=g0
  barriers g0: count=5 arrivals=1 bytes=32768 channels=ch_a,ch_b
  turns turn_bar: partitions=consumer0,consumer1 bytes=16 scope=mainloop
  smem 229472
  note 'memory_plan: ring depth 8 -> 5 to fit 232448 B of SMEM'
  note 'ping_pong: off: consumer0, consumer1 issue wgmma independently'
""")
        self.assertExpectedInline(_code(p, "consumer1") + _code(p, "producer"), """\
  code consumer1 {
    tile_loop() {persistent=True, serpentine=False, share=(1, 2), tile_group=8, tiles=(('pid_m', 'cdiv(M,128)'), ('pid_n', 'cdiv(N,128)'))} {
      seek() {group='g0', per_tile='cdiv(K,64)'}
      %acc0_c1:f32[128,128] = zeros() [chain=1 partition=consumer1]
      turn_wait() {me=1, turns=2}
      %acc_out_c1:f32[128,128] = loop(%acc0_c1) {iter_args=('acc_c1',), lb=0, ub='cdiv(K,64)', var='k'} {
        wait_ready() {group='g0'}
        %a:bf16[128,64]@smem = get() {buffer='a_smem', group='g0'}
        %b:bf16[64,128]@smem = get() {buffer='b_smem', group='g0'}
        %acc_next_c1:f32[128,128] = mma(%a, %b, %acc_c1) {pending=1} [chain=1 partition=consumer1 stage=1 order=3]
        release() {group='g0', lag=1}
        advance() {group='g0'}
        yield(%acc_next_c1)
      }
      turn_pass() {to=0, turns=2}
      %acc_out_c1_done:f32[128,128] = mma_wait(%acc_out_c1) {pending=0}
      release_tail() {group='g0', lag=1}
      %out_c1:bf16[128,128] = cast(%acc_out_c1_done) [chain=1 partition=consumer1]
      store(%out_c1) {arg='c', coords=('pid_m*128', 'pid_n*128')} [chain=1 partition=consumer1]
    }
  }
  code producer {
    tile_loop() {persistent=True, serpentine=False, tile_group=8, tiles=(('pid_m', 'cdiv(M,128)'), ('pid_n', 'cdiv(N,128)'))} {
      loop() {iter_args=(), lb=0, ub='cdiv(K,64)', var='k'} {
        acquire() {group='g0'}
        %a:bf16[128,64]@smem = load() {arg='a', buffer='a_smem', coords=('pid_m*128', 'k*64'), group='g0'} [partition=producer stage=0 order=0]
        %b:bf16[64,128]@smem = load() {arg='b', buffer='b_smem', coords=('k*64', 'pid_n*128'), group='g0'} [partition=producer stage=0 order=1]
        advance() {group='g0'}
        yield()
      }
    }
  }
""")


def test_data_partition_replicates_the_tile_and_shares_the_loads():
    t = _trace(bias=True, trans_b=True)
    before, after = t["template"], t["data_partition"]
    loads = [o for o in walk(after.body) if o.kind == "load"]
    assert loads == [o for o in walk(before.body) if o.kind == "load"] and all(o.chain is None for o in loads)
    for i in (0, 1):  # every other op once per chain, same shapes and coordinates, names suffixed
        mine = [o for o in walk(after.body) if o.chain == i]
        assert [o.kind for o in mine] == [o.kind for o in walk(before.body) if o.kind not in ("load", "loop",
                                                                                             "yield")]
        assert all(r.name.endswith(f"_c{i}") for o in mine for r in o.results)
        (store,) = [o for o in mine if o.kind == "store"]
        assert store.attr("coords") == ("pid_m*128", "pid_n*128")


def test_partition_schedule_shares_the_tiles_one_warpgroup_each():
    for config in ("ws_pp2_128x128", "ws_pp2_64x256"):
        p = _trace(config)["partition_schedule"]
        assert [(pt.name, pt.warps, pt.regs, pt.tiles) for pt in p.partitions] == [
            ("consumer0", 4, 232, (0, 2)), ("consumer1", 4, 232, (1, 2)), ("producer", 1, 40, None)]


def test_every_stage_round_trips_and_the_default_prints_as_before():
    for name, p in _trace(bias=True).items():
        assert parse_program(format_program(p)) == p, name
    plain = _trace("ws_p_128x128")["cross_tile"]
    text = format_program(plain)
    assert "tile_consumers" not in text and "tiles=" not in text.replace("tiles=((", "") and "scope=" not in text
    assert Options().tile_consumers == 1


@pytest.mark.parametrize("change,why", [
    ({"data_partition": 2}, "data_partition > 1"), ({"split_k": 2}, "split_k > 1"),
    ({"persistent": False}, "not persistent"), ({"pingpong": True}, "pingpong"), ({"cross_tile": True}, "cross_tile"),
    ({"tile_consumers": 0}, "a count below 1")])
def test_refused_combinations(change, why):
    with pytest.raises(PassError, match=why):
        pipeline.run(build(GemmRequest(1, 1, 1), replace(CONFIGS[PP], **change)))


def _edit(p, part, fn):
    """``p`` with ``fn`` applied to partition ``part``'s tile body (the tile_loop's ops)."""
    def one(pt):
        (tl,) = pt.body
        return replace(pt, body=(replace(tl, body=tuple(fn(tl.body))),))
    return replace(p, partitions=tuple(one(pt) if pt.name == part else pt for pt in p.partitions))


def test_verifier_catches_a_broken_protocol():
    p = _trace()["tile_loop"]
    check(p, "tile_loop")
    cases = {
        "must start with one seek per ring": _edit(p, "consumer1", lambda ops: [o for o in ops if o.kind != "seek"]),
        "waits on a ring outside its turn": _edit(p, "consumer0", lambda ops: [o for o in ops
                                                                               if o.kind not in ("turn_wait",
                                                                                                 "turn_pass")]),
        "walks every tile but seeks": _edit(p, "producer", lambda ops: [*_trace()["tile_loop"].partitions[1].body[0]
                                                                        .body[:1], *ops]),
        "tile_loop share": replace(p, partitions=tuple(replace(pt, body=(pt.body[0].with_attrs(share=None),))
                                                       if pt.name == "consumer1" else pt for pt in p.partitions)),
        "expects 1 releasing partitions": replace(p, partitions=tuple(replace(pt, tiles=None) for pt in p.partitions)),
        "take main-loop turns": replace(p, turns=replace(p.turns, scope="mma")),
        "t >= 2 partitions": replace(p, partitions=tuple(replace(pt, tiles=(0, 2)) if pt.tiles else pt
                                                         for pt in p.partitions)),
    }
    for why, bad in cases.items():
        with pytest.raises(VerifyError, match=why):
            check(bad, "tile_loop")


def test_a_tile_dependent_fill_count_is_refused():
    from torch_autows.passes import code_partition

    planned = _trace()["memory_plan"]

    def ragged(o):  # a K loop whose trips depend on the tile (as split_k's parts would)
        return o.with_attrs(ub="cdiv(K,64)-pid_m") if o.kind == "loop" else o
    bad = replace(planned, body=tuple(ragged(o) for o in planned.body))
    with pytest.raises(PassError, match="depends on the tile"):
        code_partition.run(bad)
