"""A head dim that is not a power of two in power-of-two column pieces (``Options.split_d``, equal ones or, with
``split_d_binary``, the widest first; templates.attention.d_pieces) instead of one padded tile: the template's IR, the
same passes, the interpreter under every policy against torch, and the runtime's view and store rules for it. Also
q/k and v/o of two head dims (192 / 128, MLA prefill): q and k in pieces, v in its own."""
from __future__ import annotations

from dataclasses import replace

import expecttest
import pytest
from programs import compile_ws_cubin

from torch_autows.codegen import gluon
from torch_autows.codegen.gluon import block_shapes
from torch_autows.interp import POLICIES, make_instance, run_partitioned, run_sequential
from torch_autows.ir import format_program, parse_program, walk
from torch_autows.passes import pipeline
from torch_autows.runtime.attention import CONFIGS, V_HEAD_DIMS, o_tma_ok, serves
from torch_autows.templates.attention import AttentionRequest, build, d_pieces, pieces
from torch_autows.verify import VerifyError, check

SPLIT = [c for c in CONFIGS if CONFIGS[c].split_d]


def test_pieces_are_equal_powers_of_two():
    assert d_pieces(192) == ((0, 64), (64, 64), (128, 64))
    assert d_pieces(96) == ((0, 32), (32, 32), (64, 32))
    assert d_pieces(128) == ((0, 128),) and d_pieces(80) == ((0, 16), (16, 16), (32, 16), (48, 16), (64, 16))
    opts = CONFIGS["ws_p_128x64_rm_g16"]
    assert pieces(192, opts) == ((0, 256),)  # padded
    assert pieces(192, replace(opts, split_d=True)) == d_pieces(192)
    assert SPLIT and all(serves(c, 96) or serves(c, 192) or serves(c, 192, 128) for c in SPLIT)
    assert [c for c in SPLIT if serves(c, 192)]


class TestSplitTemplate(expecttest.TestCase):
    def test_template_chains_qk_and_keeps_an_accumulator_per_piece(self):
        p = build(AttentionRequest(96, "bf16", False, o_tma=True), CONFIGS[SPLIT[0]])
        text = format_program(p)
        lines = [ln.strip() for ln in text.splitlines()
                 if ln.strip().startswith(("%q", "%k", "%v", "%s", "%acc", "%out", "store", "yield"))]
        self.assertExpectedInline("\n".join(lines), """\
%q:bf16[128,32]@smem = load() {arg='q', coords=('(pid_bh//Hq)*q_rb+(pid_bh%Hq)*q_rh+pid_m*128', '(pid_bh%Hq)*q_ch')}
%q_p1:bf16[128,32]@smem = load() {arg='q', coords=('(pid_bh//Hq)*q_rb+(pid_bh%Hq)*q_rh+pid_m*128', '(pid_bh%Hq)*q_ch+32')}
%q_p2:bf16[128,32]@smem = load() {arg='q', coords=('(pid_bh//Hq)*q_rb+(pid_bh%Hq)*q_rh+pid_m*128', '(pid_bh%Hq)*q_ch+64')}
%acc0:f32[128,32] = zeros()
%acc0_p1:f32[128,32] = zeros()
%acc0_p2:f32[128,32] = zeros()
%k:bf16[64,32]@smem = load() {arg='k', coords=('(pid_bh//Hq)*kv_rb+((pid_bh%Hq)//G)*kv_rh+j*64', '((pid_bh%Hq)//G)*kv_ch')}
%k_p1:bf16[64,32]@smem = load() {arg='k', coords=('(pid_bh//Hq)*kv_rb+((pid_bh%Hq)//G)*kv_rh+j*64', '((pid_bh%Hq)//G)*kv_ch+32')}
%k_p2:bf16[64,32]@smem = load() {arg='k', coords=('(pid_bh//Hq)*kv_rb+((pid_bh%Hq)//G)*kv_rh+j*64', '((pid_bh%Hq)//G)*kv_ch+64')}
%v:bf16[64,32]@smem = load() {arg='v', coords=('(pid_bh//Hq)*kv_rb+((pid_bh%Hq)//G)*kv_rh+j*64', '((pid_bh%Hq)//G)*kv_ch')}
%v_p1:bf16[64,32]@smem = load() {arg='v', coords=('(pid_bh//Hq)*kv_rb+((pid_bh%Hq)//G)*kv_rh+j*64', '((pid_bh%Hq)//G)*kv_ch+32')}
%v_p2:bf16[64,32]@smem = load() {arg='v', coords=('(pid_bh//Hq)*kv_rb+((pid_bh%Hq)//G)*kv_rh+j*64', '((pid_bh%Hq)//G)*kv_ch+64')}
%kt:bf16[32,64]@smem = trans(%k)
%kt_p1:bf16[32,64]@smem = trans(%k_p1)
%kt_p2:bf16[32,64]@smem = trans(%k_p2)
%s_k0:f32[128,64] = mma(%q, %kt)
%s_k1:f32[128,64] = mma(%q_p1, %kt_p1, %s_k0)
%s:f32[128,64] = mma(%q_p2, %kt_p2, %s_k1)
%s_m:f32[128,64] = mask(%s) {causal=False, col='j*64', kv_len='Skv', row='pid_m*128'}
%s2:f32[128,64] = mulc(%s_m) {c='qk_scale'}
%sd:f32[128,64] = sub(%s2, %m_col)
%acc_s:f32[128,32] = mul(%acc, %a_col)
%acc_s_p1:f32[128,32] = mul(%acc_p1, %a_col)
%acc_s_p2:f32[128,32] = mul(%acc_p2, %a_col)
%acc_new:f32[128,32] = mma(%p16, %v, %acc_s)
%acc_new_p1:f32[128,32] = mma(%p16, %v_p1, %acc_s_p1)
%acc_new_p2:f32[128,32] = mma(%p16, %v_p2, %acc_s_p2)
yield(%m_new, %l_new, %acc_new, %acc_new_p1, %acc_new_p2)
%out_f:f32[128,32] = mul(%acc_f, %rl_col)
%out:bf16[128,32] = cast(%out_f)
store(%out) {arg='o', coords=('(pid_bh//Hq)*o_rb+(pid_bh%Hq)*o_rh+pid_m*128', '(pid_bh%Hq)*o_ch')}
%out_f_p1:f32[128,32] = mul(%acc_f_p1, %rl_col)
%out_p1:bf16[128,32] = cast(%out_f_p1)
store(%out_p1) {arg='o', coords=('(pid_bh//Hq)*o_rb+(pid_bh%Hq)*o_rh+pid_m*128', '(pid_bh%Hq)*o_ch+32')}
%out_f_p2:f32[128,32] = mul(%acc_f_p2, %rl_col)
%out_p2:bf16[128,32] = cast(%out_f_p2)
store(%out_p2) {arg='o', coords=('(pid_bh//Hq)*o_rb+(pid_bh%Hq)*o_rh+pid_m*128', '(pid_bh%Hq)*o_ch+64')}
store_vec(%lse_v) {arg='lse', offset='pid_bh*Sq+pid_m*128', valid='Sq-pid_m*128'}""")

    def test_each_output_piece_stages_in_its_q_piece(self):
        p = pipeline.run(build(AttentionRequest(192, "bf16", True, o_tma=True), CONFIGS[SPLIT[0]]))
        stages = sorted(o.attr("stage") for pt in p.partitions for o in walk(pt.body) if o.kind == "store")
        self.assertEqual(stages, sorted(f"q{s}_c{c}" for s in ("", "_p1", "_p2") for c in (0, 1)))
        assert not [b for b in p.buffers if b.name.endswith("_stage")]


@pytest.mark.parametrize("config,d,dtype,causal,o_tma", [
    (c, *x) for c in SPLIT for x in [(96, "bf16", True, False), (96, "fp16", False, True), (192, "bf16", False, True),
                                     (192, "fp16", True, False)] if serves(c, x[0])])
def test_split_matches_torch_under_every_policy(config, d, dtype, causal, o_tma):
    before = build(AttentionRequest(d, dtype, causal, o_tma=o_tma), CONFIGS[config])
    after = pipeline.run(before, verify=True)
    for seed in range(3):
        inst = make_instance(after, seed)
        assert f"D={d}" in inst.desc
        seq = run_sequential(before, inst.inputs())
        assert inst.matches(seq), (inst.desc, inst.error(seq))
        for policy in POLICIES:
            out = run_partitioned(after, inst.inputs(), policy=policy, seed=seed, nprog=2)
            assert inst.matches(out), (policy, inst.desc, inst.error(out))


def test_binary_pieces_are_the_widest_powers_of_two_first():
    assert d_pieces(192, binary=True) == ((0, 128), (128, 64)) and d_pieces(96, binary=True) == ((0, 64), (64, 32))
    assert d_pieces(80, binary=True) == ((0, 64), (64, 16)) and d_pieces(128, binary=True) == ((0, 128),)
    assert d_pieces(224, binary=True) == ((0, 128), (128, 64), (192, 32))
    binary = [c for c in SPLIT if CONFIGS[c].split_d_binary]
    assert {d for c in binary for d in (96, 192) if serves(c, d)} == {96, 192}


def test_binary_pieces_read_and_write_the_other_width_through_alias_args():
    """192 = 128 + 64: the 64-column piece's loads and store name ``q_w64``, ``k_w64``, ``v_w64``, ``o_w64``, args that
    alias q, k, v, o (each width a TMA descriptor of its own); the text form keeps the alias (parsed back equal), the
    generated kernel takes a descriptor per alias, and the interpreter runs the alias on its base's tensor."""
    config = next(c for c in SPLIT if CONFIGS[c].split_d_binary and serves(c, 192))
    p = build(AttentionRequest(192, "bf16", False, o_tma=True), CONFIGS[config])
    aliases = {a.name: a.alias for a in p.args if a.alias}
    assert aliases == {"q_w64": "q", "k_w64": "k", "v_w64": "v", "o_w64": "o"}
    widths = {(o.attr("arg"), o.results[0].type.shape[-1] if o.results else None) for o in walk(p.body)
              if o.kind in ("load", "store")}
    assert widths == {("q", 128), ("q_w64", 64), ("k", 128), ("k_w64", 64), ("v", 128), ("v_w64", 64),
                      ("o", None), ("o_w64", None)}
    assert parse_program(format_program(p)) == p and "arg q_w64: tensor<bf16>[BHSq, D] alias q" in format_program(p)
    assert p.base_arg("o_w64") == "o" and p.base_arg("o") == "o"
    after = pipeline.run(p)
    src = gluon.generate(after)
    assert "q_w64_desc" in src and "o_w64_desc" in src
    assert block_shapes(after)["q_w64"][0] == (64, 64) and block_shapes(after)["q"][0] == (64, 128)  # a chain's rows
    # without the pointer store there is no alias of o
    q = build(AttentionRequest(192, "bf16", False), CONFIGS[config])
    assert "o_w64" not in {a.name for a in q.args} and q.arg("o").kind == "ptr"


def test_o_tma_takes_split_head_dims_and_refuses_padded_ones():
    split, padded = CONFIGS[SPLIT[0]], CONFIGS["ws_p_128x64_rm_g16"]
    assert o_tma_ok(512, 192, split) and not o_tma_ok(512, 192, padded)
    with pytest.raises(ValueError, match="would store 64 columns of the next head"):
        build(AttentionRequest(192, o_tma=True), padded)


def test_lead_chains_issues_every_qk_piece_before_the_deferred_pv():
    """In a pipelined step, step j-1's deferred P V is issued right after step j's leading mmas. A head dim in pieces
    chains its Q K^T pieces onto one accumulator: without ``lead_chains`` only the first piece leads (P V goes between
    the pieces, so S waits for it), with it all of them do and S is waited with the P V pieces still in flight; the
    result is the same under every interpreter policy."""
    config = next(c for c in SPLIT if CONFIGS[c].defer_mma and serves(c, 192))

    def steady(opts):
        """(the mmas of the pipelined step in issue order, mma -> the pending count of its wait)"""
        after = pipeline.run(build(AttentionRequest(192, "bf16", False, o_tma=True), opts))
        part = next(p for p in after.partitions if p.name == "consumer0")
        loop = next(o for o in walk(part.body) if o.kind == "loop" and any(x.attr("lag") == 1 for x in o.body))
        return ([o.results[0].name for o in loop.body if o.kind == "mma"],
                {o.operands[0]: o.attr("pending") for o in loop.body if o.kind == "mma_wait"})

    n = len(d_pieces(192, CONFIGS[config].split_d_binary))
    mmas, _ = steady(CONFIGS[config])
    assert mmas[0].startswith("s_") and mmas[1].startswith("acc_new")  # P V issued right after the first piece
    mmas, waits = steady(replace(CONFIGS[config], lead_chains=True))
    assert all(m.startswith("s") for m in mmas[:n]) and all(m.startswith("acc_new") for m in mmas[n:2 * n])
    assert waits["s_c0"] == n  # S retired with the n P V pieces still in flight
    before = build(AttentionRequest(192, "bf16", True, o_tma=True), replace(CONFIGS[config], lead_chains=True))
    after = pipeline.run(before, verify=True)
    for policy in POLICIES:
        inst = make_instance(after, 0)
        assert inst.matches(run_partitioned(after, inst.inputs(), policy=policy, seed=0, nprog=2)), policy


@pytest.mark.parametrize("config,lead", [(c, False) for c in SPLIT] + [("ws_p_128x64_rm_g16_sdb_dm_s3", True)])
def test_no_wait_reads_a_piece_another_mma_accumulates_onto(config, lead):
    """A chained Q K^T piece (the accumulator of the next piece's mma) gets no mma_wait of its own: the chain's last
    wait retires it (wgmma groups retire in order), and a wait on it while the next piece's wgmma runs reads the
    registers that wgmma writes, which makes ptxas serialize every wgmma of the kernel (C7514; it cost the lead_chains
    variant 20-28% on the H200). step_overlap (steps without deferred mmas) and software_pipeline (lead_chains) both
    follow it; the interpreter still matches the reference under every policy."""
    d, dv = next((d, dv) for d, dv in ((192, 192), (96, 96), (192, 128)) if serves(config, d, dv))
    opts = replace(CONFIGS[config], lead_chains=lead or CONFIGS[config].lead_chains)
    after = pipeline.run(build(AttentionRequest(d, "bf16", True, o_tma=True, d_v=dv if dv != d else 0), opts),
                         verify=True)
    seen = set()
    for part in after.partitions:
        for loop in (o for o in walk(part.body) if o.kind == "loop"):
            chained = {o.operands[2] for o in loop.body if o.kind == "mma" and len(o.operands) == 3}
            waited = {o.operands[0] for o in loop.body if o.kind == "mma_wait"}
            assert not chained & waited, (part.name, chained & waited)
            seen |= {x for x in chained if x.startswith("s_k0")}
    assert seen  # the chains were there (each consumer's first Q K^T piece)
    for policy in POLICIES[:2]:
        inst = make_instance(after, 0)
        assert inst.matches(run_partitioned(after, inst.inputs(), policy=policy, seed=0, nprog=2)), policy


def test_verify_catches_a_wait_on_a_piece_in_flight():
    """The verifier's rule behind the test above (verify.sync._check_waits): a wait on the first Q K^T piece while
    the second accumulates onto it (what software_pipeline emitted before) is refused with the reason."""
    opts = replace(CONFIGS["ws_p_128x64_rm_g16_sdb_dm_s3"], lead_chains=True)
    text = format_program(pipeline.run(build(AttentionRequest(192, "bf16", False, o_tma=True), opts)))
    good = "        %s_c0_r:f32[64,64] = mma_wait(%s_c0) {pending=2}"
    assert text.count(good) == 1
    check(parse_program(text))
    bad = text.replace(good, "        %s_k0_c0_r:f32[64,64] = mma_wait(%s_k0_c0) {pending=3}\n" + good)
    with pytest.raises(VerifyError, match="waits on %s_k0_c0 while %s_c0 accumulates onto it in flight"):
        check(parse_program(bad))


# DeepSeek-style MLA prefill: q and k of head dim 192 (pieces 128 + 64), v and o of 128 (one piece); every config the
# runtime lists for the pair (runtime.attention.V_HEAD_DIMS)
_MLA = [(c, *x) for c in sorted({c for cs in V_HEAD_DIMS.values() for c in cs})
        for x in [("bf16", False, True), ("fp16", True, False), ("bf16", True, True)]]


@pytest.mark.parametrize("config,dtype,causal,o_tma", _MLA)
def test_mla_head_dims_match_torch_under_every_policy(config, dtype, causal, o_tma):
    before = build(AttentionRequest(192, dtype, causal, o_tma=o_tma, d_v=128), CONFIGS[config])
    assert before.name.startswith("attn_fwd_%s_d192v128_" % dtype)
    widths = {(o.attr("arg"), o.results[0].type.shape[-1]) for o in walk(before.body) if o.kind == "load"}
    assert widths == {("q", 128), ("q_w64", 64), ("k", 128), ("k_w64", 64), ("v", 128)}  # v in one piece
    after = pipeline.run(before, verify=True)
    for seed in range(3):
        inst = make_instance(after, seed)
        assert "D=192 Dv=128" in inst.desc and inst.reference["o"].shape[-1] % 128 == 0
        seq = run_sequential(before, inst.inputs())
        assert inst.matches(seq), (inst.desc, inst.error(seq))
        for policy in POLICIES:
            out = run_partitioned(after, inst.inputs(), policy=policy, seed=seed, nprog=2)
            assert inst.matches(out), (policy, inst.desc, inst.error(out))


@pytest.mark.parametrize("config,causal", [(c, causal) for c in sorted({c for cs in V_HEAD_DIMS.values() for c in cs})
                                           for causal in (False, True)])
def test_mla_head_dims_compile_without_spills(config, causal):
    kernel, s = compile_ws_cubin(pipeline.run(build(AttentionRequest(192, "bf16", causal, o_tma=True, d_v=128),
                                                    CONFIGS[config])))
    assert "wgmma.mma_async.sync.aligned.m64n128k16" in kernel.asm["ptx"]  # P V: one 128-column piece


def test_mla_head_dims_refused_where_a_tile_would_cross_heads():
    with pytest.raises(ValueError, match="need tiles that end at each head's last column"):
        build(AttentionRequest(192, "bf16", False, d_v=128), CONFIGS["ws_p_128x64_rm_g16"])  # 192 padded to 256
    with pytest.raises(ValueError, match="v head dim 80 not served"):
        AttentionRequest(192, d_v=80)
