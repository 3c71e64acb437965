"""O staged in the bytes of the ring read last (``Options.store_in_ring``, FlashAttention-3's epilogue): which rings
host the staging tiles (buffers.stage_hosts), where memory_plan puts them, the meeting, drain signal and producer gate
code_partition adds, the Gluon, both interpreters on the configs that take it, the verifier's and the interpreter's
answers to the order broken, and the offline sm_90a compile."""
from __future__ import annotations

from dataclasses import replace

import pytest
from programs import violation_kinds

from torch_autows import verify
from torch_autows.codegen import gluon
from torch_autows.interp import POLICIES, make_instance, run_partitioned, run_sequential
from torch_autows.ir import walk
from torch_autows.passes import buffers, memory_plan, pipeline
from torch_autows.runtime.attention import CONFIGS
from torch_autows.runtime.attention_bwd import CONFIGS as BWD_CONFIGS
from torch_autows.templates.attention import AttentionRequest, build
from torch_autows.templates.attention_bwd import AttentionBwdRequest
from torch_autows.templates.attention_bwd import build as build_bwd

D256 = "ws_p_128x64_rm_g16_dm_s3_sr"
D192 = "ws_p_128x64_rm_g16_sdb_dm_s3_lc_qr_sr"
RING = [c for c in CONFIGS if CONFIGS[c].store_in_ring]


def _after(config=D256, d=256, causal=False, o_tma=True):
    return pipeline.run(build(AttentionRequest(d, "bf16", causal, o_tma=o_tma), CONFIGS[config]), verify=True)


def _base(config):
    return config.removesuffix("_sr")


def test_the_configs_are_the_one_q_copy_wide_picks():
    assert sorted(RING) == sorted([D256, D192])
    for c in RING:
        assert CONFIGS[c] == replace(CONFIGS[_base(c)], store_in_ring=True) and CONFIGS[c].tile_buffers == 1


@pytest.mark.parametrize("config,d,hosts", [(D256, 256, ("v_smem",)), (D192, 192, ("v_smem", "v_p1_smem"))])
def test_staging_tiles_lie_in_v_and_q_is_not_a_stage(config, d, hosts):
    p = _after(config, d)
    assert buffers.stage_hosts(p) == hosts
    hosted = memory_plan.hosted_stages(p)
    stages = sorted(b.name for b in p.buffers if b.name.endswith("_stage"))
    assert sorted(hosted) == stages and set(hosted.values()) == {"v_smem"}  # all in the widest V piece
    assert not [o for pt in p.partitions for o in walk(pt.body) if o.kind == "store" and o.attr("stage")]
    # no staging bytes of its own: the drain and meeting barriers (8 B each), and at d=192 the ready/empty pairs of
    # V's three slots, which shared K's ring in the base config
    assert p.smem_bytes == _after(_base(config), d).smem_bytes + 16 + (48 if d == 192 else 0)
    # K and V fill rings of their own: the gate holds V's first fill a tile, not K's
    assert {c.group for c in p.channels if c.buffer.startswith("v")}.isdisjoint(
        {c.group for c in p.channels if c.buffer.startswith("k")})


def test_off_or_pointer_store_changes_nothing():
    assert buffers.stage_hosts(_after(_base(D256))) == ()
    p = _after(o_tma=False)
    assert buffers.stage_hosts(p) == () and not memory_plan.hosted_stages(p)
    assert not [o for pt in p.partitions for o in walk(pt.body) if o.kind in ("store_drained", "wait_drained")]


def test_q_released_before_the_stores_and_the_order_of_the_turn():
    p = _after()
    ops = [o for o in p.partition("consumer0").body[0].body if o.kind != "loop"]
    c0 = [o.kind for o in ops]
    tail = c0[c0.index("release"):]  # after the key loop: V's tail release, Q's release, then the stores
    g1 = next(g.name for g in p.groups if any(c.startswith("ch_q") for c in g.channels))
    q_release = next(i for i, o in enumerate(ops) if o.kind == "release" and o.attr("group") == g1)
    assert q_release < c0.index("chain_sync")  # Q's slot goes back before the tile's meeting and stores
    i = tail.index("chain_sync")
    assert tail[i:i + 3] == ["chain_sync", "store", "store_drained"], tail
    prod = p.partition("producer").body[0].body
    loop = next(o for o in prod if o.kind == "loop")
    kinds = [(o.kind, o.attr("group")) for o in loop.body if o.kind in ("acquire", "wait_drained")]
    v = next(g.name for g in p.groups if "ch_v" in g.channels)
    assert kinds == [("acquire", "g0"), ("wait_drained", None), ("acquire", v)], kinds


def test_gluon_views_the_stage_in_v_and_gates_the_first_v_fill():
    src = gluon.generate(_after())
    assert ("out_c1_stage = v_smem._reinterpret(gl.bfloat16, [3, 64, 256], o_desc.layout).index(1)" in src)
    prod = src.split("def producer(")[1].split("@gluon.jit")[0]
    assert "if j == 0:\n                mbarrier.wait(g2_drained.index(0), (g2_drained_n & 1) ^ 1)" in prod
    cons = src.split("def consumer0(")[1].split("@gluon.jit")[0]
    assert "tma.store_wait(0)  # TMA has read the staging tiles\n        mbarrier.arrive(g2_drained.index(0))" in cons
    assert "mbarrier.init(g2_drained.index(0), count=2)" in src


@pytest.mark.parametrize("config,d,causal", [(D256, 256, False), (D256, 256, True), (D192, 192, True)])
def test_matches_torch_under_every_policy(config, d, causal):
    before = build(AttentionRequest(d, "bf16", causal, o_tma=True), CONFIGS[config])
    after = pipeline.run(before, verify=True)
    for seed in range(3):
        inst = make_instance(after, seed)
        seq = run_sequential(before, inst.inputs())
        for policy in POLICIES:
            out = run_partitioned(after, inst.inputs(), policy=policy, seed=seed, nprog=2 + seed % 2)
            assert inst.matches(out), (policy, inst.desc, inst.error(out))
            assert all((out[k] == seq[k]).all() for k in ("o", "lse"))


def test_one_key_block_a_tile():
    """One key block a tile: the producer runs whole tiles ahead, so the gate is all that holds V's fills."""
    after = _after(causal=False)
    for seed in range(3):
        inst = make_instance(after, seed, shape=(1, 3, 1, 384, 40))
        out = run_partitioned(after, inst.inputs(), policy="adversarial", seed=seed, nprog=1)
        assert inst.matches(out), inst.error(out)


def _drop(program, kind, part=None):
    def visit(ops):
        return tuple(replace(o, body=visit(o.body)) if o.body else o for o in ops if o.kind != kind)
    return replace(program, partitions=tuple(replace(pt, body=visit(pt.body)) if part in (None, pt.name) else pt
                                             for pt in program.partitions))


@pytest.mark.parametrize("kind,part,caught", [
    ("wait_drained", "producer", {"overwrite"}),  # V's next fill lands under O's store
    ("chain_sync", None, {"overwrite"}),  # a chain's O lands on V the other still reads
])
def test_the_order_broken_is_caught(kind, part, caught):
    mutated = _drop(_after(), kind, part)
    with pytest.raises(verify.VerifyError, match=kind):
        verify.check(mutated)
    kinds = violation_kinds(mutated, 4, POLICIES, shape=(1, 2, 1, 384, 384))
    assert caught & set(kinds) and set(kinds) <= caught | {"ok", "unfilled-read"}, kinds


def test_store_drained_dropped_is_caught():
    mutated = _drop(_after(), "store_drained")
    with pytest.raises(verify.VerifyError, match="store_drained"):
        verify.check(mutated)
    assert set(violation_kinds(mutated, 2, ("round_robin",), shape=(1, 2, 1, 384, 384))) - {"ok"}


@pytest.mark.parametrize("config,d,causal", [(D256, 256, True), (D192, 192, False)])
def test_compiles_for_sm90a_without_spills(config, d, causal):
    from programs import compile_ws_cubin

    _, summary = compile_ws_cubin(_after(config, d, causal))
    assert summary["spills"] == 0


# The attention backward (one tile a CTA): dK/dV after the walk over the queries, staged in the bytes of the Q/dO ring
# the walk read last, stored by TMA; the chains meet first, and nothing fills the ring after the stores.
BWD = [c for c in BWD_CONFIGS if BWD_CONFIGS[c].store_in_ring]


def _bwd(config="bwd_64x128_dp2_dqsplit_fold_sr", d=128, causal=False, kv_tma=True):
    return pipeline.run(build_bwd(AttentionBwdRequest(d, "bf16", causal, dq="reduce", kv_tma=kv_tma),
                                  BWD_CONFIGS[config]), verify=True)


def test_bwd_configs_are_the_reduce_picks():
    assert sorted(BWD) == ["bwd_128x128_dp2_dqsplit_fold_sr", "bwd_64x128_dp2_dqsplit_fold_sr"]
    for c in BWD:
        assert BWD_CONFIGS[c] == replace(BWD_CONFIGS[_base(c)], store_in_ring=True)
        assert not BWD_CONFIGS[c].persistent


@pytest.mark.parametrize("config,d", [("bwd_64x128_dp2_dqsplit_fold_sr", 128), ("bwd_128x128_dp2_dqsplit_fold_sr", 64)])
def test_bwd_dk_dv_lie_in_the_q_do_ring_and_only_meet(config, d):
    p = _bwd(config, d)
    hosts = buffers.stage_hosts(p)
    assert set(hosts) <= {"q_smem", "do_smem"} and hosts
    hosted = memory_plan.hosted_stages(p)
    assert sorted(hosted) == sorted(f"{x}16_c{c}_stage" for x in ("dk", "dv") for c in (0, 1))
    # no bytes of their own, and one barrier more than the pointer form: the chains' meeting (no drain, no gate)
    assert p.smem_bytes == _bwd(_base(config), d, kv_tma=False).smem_bytes + 8
    kinds = {o.kind for pt in p.partitions for o in walk(pt.body)}
    assert "chain_sync" in kinds and not kinds & {"store_drained", "wait_drained"}
    # the hosts keep their barrier ring (lse2/delta's too): nothing is filled after the stores
    assert len({c.group for c in p.channels if c.buffer in ("q_smem", "do_smem", "lvs_smem", "dls_smem")}) == 1
    for name in ("consumer0", "consumer1"):
        top = [o.kind for o in p.partition(name).body[0].body]
        after = top[top.index("loop") + 1:]
        assert after.index("chain_sync") < after.index("store"), after
        assert "tma_reduce_add" not in after  # the dQ reduces all precede the stores (codegen's bulk-group count)
    src = gluon.generate(p)
    assert "tma.async_copy_shared_to_global(dk_desc" in src and "gl.store(" not in src


def test_bwd_pointer_form_without_whole_tiles():
    p = _bwd(kv_tma=False)
    assert buffers.stage_hosts(p) == () and not memory_plan.hosted_stages(p)


@pytest.mark.parametrize("config,d,causal", [("bwd_64x128_dp2_dqsplit_fold_sr", 128, False),
                                             ("bwd_64x128_dp2_dqsplit_fold_sr", 128, True),
                                             ("bwd_128x128_dp2_dqsplit_fold_sr", 64, True)])
def test_bwd_matches_torch_under_every_policy(config, d, causal):
    after = _bwd(config, d, causal)
    for seed in range(2):
        inst = make_instance(after, seed, shape=(1, 2, 1 + seed, 128 + 64 * seed, 256))
        for policy in POLICIES:
            out = run_partitioned(after, inst.inputs(), policy=policy, seed=seed, nprog=2)
            assert inst.matches(out), (policy, inst.desc, inst.error(out))


def test_bwd_meeting_dropped_is_caught():
    mutated = _drop(_bwd(), "chain_sync")
    with pytest.raises(verify.VerifyError, match="chain_sync"):
        verify.check(mutated)
    # a chain's staging write lands on the Q/dO slot the other still reads: it reads bytes no fill left there
    kinds = violation_kinds(mutated, 3, POLICIES, shape=(1, 2, 1, 128, 256))
    assert set(kinds) - {"ok"} and set(kinds) <= {"ok", "overwrite", "unfilled-read"}, kinds


@pytest.mark.parametrize("config,d", [("bwd_64x128_dp2_dqsplit_fold_sr", 128), ("bwd_128x128_dp2_dqsplit_fold_sr", 64)])
def test_bwd_persistent_walk_drains_gates_and_lowers(config, d):
    """The ``_sr`` backward as a persistent walk (measured, not picked: sweeps/2026-12-05-h100-attention-bwd-
    persistent-sr.json): the next tile's Q/dO fills wait for this tile's dK/dV stores out of their bytes (drain and
    gate), codegen lets a consumer mix its dQ reduces with those one-copy stores (every wait on them is for all groups),
    and the walk matches torch under every policy; a store staged in two copies beside reduces stays refused (its
    ``store_wait(1)`` would count a reduce as the store in flight)."""
    opts = replace(BWD_CONFIGS[config], persistent=True)
    after = pipeline.run(build_bwd(AttentionBwdRequest(d, "bf16", False, dq="reduce", kv_tma=True), opts), verify=True)
    kinds = {o.kind for pt in after.partitions for o in walk(pt.body)}
    assert {"store_drained", "wait_drained", "tma_reduce_add", "store"} <= kinds
    src = gluon.generate(after)
    assert "tma.async_copy_shared_to_global(dk_desc" in src and "async_reduce_add_shared_to_global" in src
    for seed in range(2):
        inst = make_instance(after, seed, shape=(1, 2, 1 + seed, 128 + 64 * seed, 256))
        for policy in POLICIES:
            out = run_partitioned(after, inst.inputs(), policy=policy, seed=seed, nprog=2)
            assert inst.matches(out), (policy, inst.desc, inst.error(out))
    two = replace(after, buffers=tuple(replace(b, count=2) if b.name == "dk16_c0_stage" else b
                                       for b in after.buffers))
    with pytest.raises(ValueError, match="issues TMA stores and reduces"):
        gluon.generate(two)
