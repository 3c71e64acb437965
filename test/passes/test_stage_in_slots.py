"""A TMA store staged in a per-tile slot its partition has finished reading (passes/buffers.stage_in_slots): the
attention forward's O in its chain's Q slot (``AttentionRequest.o_tma``), before/after IR, what the rule refuses,
the generated Gluon, and the interpreter catching the slot handed back before TMA has read it."""
from __future__ import annotations

import functools
from dataclasses import replace

import expecttest
import pytest
from programs import violation_kinds

from torch_autows.codegen import gluon
from torch_autows.interp import POLICIES, make_instance, run_partitioned, run_sequential
from torch_autows.ir import TileType, Value, op, walk
from torch_autows.passes import buffers, pipeline
from torch_autows.runtime.attention import CONFIGS, o_tma_ok, serves
from torch_autows.templates.attention import AttentionRequest, build

PICK = "ws_p_128x128_q2_rm_g16"


def _after(d=128, causal=False, config=PICK, o_tma=True):
    return pipeline.run(build(AttentionRequest(d, "bf16", causal, o_tma=o_tma), CONFIGS[config]))


def _consumer_lines(program, part="consumer0"):
    return [ln.strip() for ln in gluon.generate(program).split(f"def {part}(")[1].split("@gluon.jit")[0].splitlines()]


class TestStageInSlots(expecttest.TestCase):
    def test_o_stages_in_its_chains_q_slot(self):
        p = _after()
        stores = [(pt.name, o.operands, o.attr("stage")) for pt in p.partitions for o in walk(pt.body)
                  if o.kind == "store"]
        self.assertEqual(stores, [("consumer0", ("out_c0", "q_c0"), "q_c0"), ("consumer1", ("out_c1", "q_c1"), "q_c1")])
        assert not [b for b in p.buffers if b.name.endswith("_stage")]  # no SMEM of its own
        assert p.smem_bytes == _after(o_tma=False).smem_bytes  # the same plan as the pointer store's
        self.assertEqual(p.arg("o").kind, "tensor")

    def test_q_slot_released_after_the_store_waits(self):
        lines = _consumer_lines(_after())
        i = lines.index("tma.async_copy_shared_to_global(o_desc, [pid_bh // Hq * o_rb + pid_bh % Hq * o_rh + "
                        "pid_m * 128, pid_bh % Hq * o_ch], v_q_c0)")
        self.assertExpectedInline("\n".join(lines[i - 3:i + 4]), """\
# store(%out_c0, %q_c0) {arg='o', coords=('(pid_bh//Hq)*o_rb+(pid_bh%Hq)*o_rh+pid_m*128', '(pid_bh%Hq)*o_ch'), stage='q_c0'} [chain=0 partition=consumer0]  <consumer0>
v_q_c0.store(v_out_c0)  # q_c0's slot, read for the last time before this
fence_async_shared()
tma.async_copy_shared_to_global(o_desc, [pid_bh // Hq * o_rb + pid_bh % Hq * o_rh + pid_m * 128, pid_bh % Hq * o_ch], v_q_c0)
tma.store_wait(0)  # TMA has read the slot: its release may hand it back to the producer
# release() {group='g1', lag=0}  <consumer0>
mbarrier.arrive(g1_empty.index(g1_s))""")

    def test_pointer_form_unchanged(self):
        p = _after(o_tma=False)
        assert [o.kind for o in walk(p.partition("consumer0").body) if o.kind.startswith("store")] == \
            ["store_ptr", "store_vec"]


def _tile(name, dtype="bf16", shape=(64, 128), space=None):
    return Value(name, TileType(dtype, shape, space) if space else TileType(dtype, shape))


def _body(*, reader_after=False, other_partition=False, shape=(64, 128)):
    """load %x (producer) -> mma reading %x (consumer) -> store of a register tile (consumer), chain 0."""
    ops = [replace(op("load", [_tile("x", shape=shape, space="smem")], arg="x", coords=("0", "0")), chain=0,
                   partition="producer"),
           replace(op("zeros", [_tile("acc", "f32", (64, 64))]), chain=0, partition="consumer0"),
           replace(op("trans", [_tile("xt", shape=shape[::-1], space="smem")], ["x"]), chain=0,
                   partition="consumer1" if other_partition else "consumer0"),
           replace(op("cast", [_tile("out")], ["acc"]), chain=0, partition="consumer0"),
           replace(op("store", [], ["out"], arg="o", coords=("0", "0")), chain=0, partition="consumer0")]
    if reader_after:
        ops.append(replace(op("trans", [_tile("xt2", shape=shape[::-1], space="smem")], ["x"]), chain=0,
                           partition="consumer0"))
    return tuple(ops)


def _staged(body):
    return [o.attr("stage") for o in buffers.stage_in_slots(body) if o.kind == "store"]


def test_rule_takes_a_slot_read_only_before_the_store_by_its_partition():
    assert _staged(_body()) == ["x"]


@pytest.mark.parametrize("why", ["reader_after", "other_partition", "shape"])
def test_rule_refuses(why):
    """A reader after the store (it would read O), a reader in another partition (it may still hold the slot), a
    tile of another type: the store keeps its own staging buffer."""
    kw = {"shape": (64, 64)} if why == "shape" else {why: True}
    assert _staged(_body(**kw)) == [None]


_CASES = [(config, d, dtype, causal) for config in CONFIGS if not CONFIGS[config].cross_tile
          for d, dtype, causal in [(64, "bf16", False), (128, "fp16", True), (256, "bf16", True)]
          if serves(config, d, causal=causal)]


@pytest.mark.parametrize("config,d,dtype,causal", _CASES)
def test_o_tma_matches_torch_under_every_policy(config, d, dtype, causal):
    before = build(AttentionRequest(d, dtype, causal, o_tma=True), CONFIGS[config])
    after = pipeline.run(before)
    for seed in range(3):
        inst = make_instance(after, seed)
        assert inst.scalars["Sq"] % CONFIGS[config].block_m == 0
        seq = run_sequential(before, inst.inputs())
        assert inst.matches(seq), (inst.desc, inst.error(seq))
        for policy in POLICIES:
            out = run_partitioned(after, inst.inputs(), policy=policy, seed=seed, nprog=2 + seed % 2)
            assert inst.matches(out), (policy, inst.desc, inst.error(out))


def _move_release_before_store(program, part="consumer0"):
    """The Q slot's release (and advance) moved ahead of the staged store: the producer may refill the slot while the
    consumer writes O into it or TMA reads it."""
    def visit(ops):
        ops = [replace(o, body=tuple(visit(o.body))) if o.body else o for o in ops]
        st = next((i for i, o in enumerate(ops) if o.kind == "store" and o.attr("stage")), None)
        if st is None:
            return ops
        rel = next(i for i, o in enumerate(ops) if i > st and o.kind == "release")
        moved = ops[rel:rel + 2]
        assert [o.kind for o in moved] == ["release", "advance"]
        return ops[:st] + moved + ops[st:rel] + ops[rel + 2:]
    return replace(program, partitions=tuple(replace(pt, body=tuple(visit(pt.body))) if pt.name == part else pt
                                             for pt in program.partitions))


def test_release_before_the_staged_store_is_caught():
    mutated = _move_release_before_store(_after(64, False, "ws_p_128x128_q2"))
    kinds = violation_kinds(mutated, 6, POLICIES)
    # the store reads the slot it has released (or the producer's refill has not landed yet): every run says so
    assert set(kinds) <= {"use-after-release", "unfilled-read", "overwrite"} and "use-after-release" in kinds, kinds


def test_runtime_takes_o_tma_only_for_whole_tiles_and_power_of_two_heads():
    opts = CONFIGS[PICK]
    assert o_tma_ok(512, 128, opts) and o_tma_ok(1024, 64, opts)
    assert not o_tma_ok(1000, 128, opts)  # a ragged last tile would store into the next head's rows
    assert not o_tma_ok(512, 96, opts)  # tiles of 128 columns: 32 of them are the next head's
    assert not o_tma_ok(512, 128, CONFIGS["ws_p_128x128_q2_rm_g16_xt"])  # cross_tile refuses TMA stores
    with pytest.raises(ValueError, match="o_tma needs tiles that end at the head's last column"):
        build(AttentionRequest(96, o_tma=True), opts)


# ------------------------------------------------------------------------------------------ the backward's gradients


@functools.cache
def _bwd_programs():
    """(name, request, before) of every served backward main kernel (each form) and dQ kernel, with the request the
    runtime takes for whole tiles (runtime.attention_bwd.tma_request)."""
    from torch_autows.runtime import attention_bwd as rt
    from torch_autows.templates.attention_bwd import AttentionBwdRequest
    from torch_autows.templates.attention_bwd import build as build_bwd
    from torch_autows.templates.attention_bwd_dq import AttentionBwdDqRequest
    from torch_autows.templates.attention_bwd_dq import build as build_dq

    out = []
    for config, mode, d in [(c, m, d) for c in rt.CONFIGS for m in ("separate", "reduce") for d in (64, 128)
                            if rt.serves(c, d, m)]:
        req = AttentionBwdRequest(d, "bf16", d == 64, dq="none" if mode == "separate" else mode)
        tma = rt.tma_request("attention_bwd", req, rt.CONFIGS[config], True, "kv_tma")
        out.append((f"{config}/{mode}/d{d}", tma, build_bwd(tma, rt.CONFIGS[config])))
    for config, d in [(c, d) for c in rt.DQ_CONFIGS for d in (64, 128) if rt.dq_serves(c, d)]:
        req = AttentionBwdDqRequest(d, "bf16", d == 128)
        tma = rt.tma_request("attention_bwd_dq", req, rt.DQ_CONFIGS[config], True, "dq_tma")
        out.append((f"dq/{config}/d{d}", tma, build_dq(tma, rt.DQ_CONFIGS[config])))
    return out


def _tma(req) -> bool:
    return getattr(req, "kv_tma", False) or getattr(req, "dq_tma", False)


def test_backward_gradients_stage_in_their_own_slots():
    """dK and dV in the chain's K and V slots, dQ (the dQ kernel) in the chain's Q slot; where a store could not stage
    (the dq_split configs: K is read by both chains, so dV finds no slot) the runtime keeps the pointer stores, but
    with store_in_ring (their ``_sr`` twins), where dK and dV lie in the bytes of the Q/dO ring."""
    from torch_autows.passes.memory_plan import hosted_stages

    staged, kept = {}, []
    for name, req, before in _bwd_programs():
        after = pipeline.run(before)
        hosted = hosted_stages(after)
        stores = [(o.operands[0].rsplit("_c", 1)[0],
                   o.attr("stage") or hosted.get(f"{o.operands[0]}_stage", "").removesuffix("_smem") + "_ring")
                  for pt in after.partitions for o in walk(pt.body) if o.kind == "store"]
        if _tma(req):
            assert stores and all(s != "_ring" for _, s in stores), (name, stores)
            staged[name] = sorted({(x, s.rsplit("_c", 1)[0]) for x, s in stores})
        else:
            assert not stores, (name, stores)
            kept.append(name)
    assert staged["bwd_64x128_dp2/separate/d128"] == [("dk16", "k"), ("dv16", "v")]
    assert staged["bwd_64x128_dp2_p_fold/reduce/d64"] == [("dk16", "k"), ("dv16", "v")]
    assert staged["dq/dq_128x128_dp2_p/d128"] == [("dq16", "q")]
    assert {x for _, x in staged["bwd_64x128_dp2_dqsplit_fold_sr/reduce/d128"]} <= {"q_ring", "do_ring"}
    assert {x for _, x in staged["bwd_128x128_dp2_dqsplit_fold_sr/reduce/d64"]} <= {"q_ring", "do_ring"}
    assert kept and all("dqsplit" in n and "_sr/" not in n for n in kept), kept


@pytest.mark.parametrize("name", [n for n, r, _ in _bwd_programs() if _tma(r)])
def test_backward_tma_forms_match_torch_under_every_policy(name):
    from torch_autows.interp import interpret_report

    _, _, before = next(x for x in _bwd_programs() if x[0] == name)
    ok, report = interpret_report(before, pipeline.run(before, verify=True), seeds=3)
    assert ok, report
