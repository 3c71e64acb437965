"""passes/cross_tile: the IR it makes (golden text of the next-tile step), what verify checks of it, where it
leaves the program alone, and the Gluon the walk becomes."""
from __future__ import annotations

from dataclasses import replace

import expecttest
import pytest

from torch_autows.codegen.gluon import generate
from torch_autows.ir import format_op, format_program, parse_program
from torch_autows.passes import pipeline
from torch_autows.runtime.attention import CONFIGS
from torch_autows.templates.attention import AttentionRequest, build
from torch_autows.verify import VerifyError, check

XT = "ws_p_128x128_q2_rm_g16_xt"


def _trace(config=XT, d=128, causal=True, **kw):
    trace: list = []
    pipeline.run(build(AttentionRequest(d, "bf16", causal), replace(CONFIGS[config], **kw)), trace=trace)
    return dict(trace)


def _step(p, part="consumer0") -> str:
    """The top-level ops of the partition's tile_next (nested loop bodies left out), one line each."""
    (tl,) = p.partition(part).body
    nx = next(o for o in tl.body if o.kind == "tile_next")
    return "\n".join(format_op(o)[0].split(" [")[0] for o in (nx, *nx.body)) + "\n"


class TestCrossTile(expecttest.TestCase):
    def test_next_tile_step(self):
        self.assertExpectedInline(_step(_trace()["cross_tile"]), """\
%acc_f_c0_loop_lt:f32[64,128], %a_col_c0_last_lt:f32[64,1], %p16_c0_last_lt:bf16[64,128], %l_f_c0_lt:f32[64], %m_f_c0_lt:f32[64] = tile_next(%acc_f_c0_loop, %a_col_c0_last, %p16_c0_last, %l_f_c0, %m_f_c0) {iter_args=('acc_f_c0_loop_pt', 'a_col_c0_last_pt', 'p16_c0_last_pt', 'l_f_c0_pt', 'm_f_c0_pt')} {
release() {group='g1', lag=0}
advance() {group='g1'}
%v_epi_pt:bf16[128,128]@smem = get() {buffer='v_smem', group='g2', lag=1}
%acc_s_c0_epi_pt:f32[64,128] = mul(%acc_f_c0_loop_pt, %a_col_c0_last_pt)
%acc_f_c0_pt:f32[64,128] = mma(%p16_c0_last_pt, %v_epi_pt, %acc_s_c0_epi_pt) {pending=0, wait=False}
wait_ready() {group='g1'}
%q_c0_nx:bf16[64,128]@smem = get() {buffer='q_c0_smem', group='g1'}
wait_ready() {group='g0'}
%k_pro_nx:bf16[128,128]@smem = get() {buffer='k_smem', group='g0'}
%kt_c0_pro_nx:bf16[128,128]@smem = trans(%k_pro_nx)
%s_c0_pro_nx:f32[64,128] = mma(%q_c0_nx, %kt_c0_pro_nx) {pending=0, wait=False}
%acc_f_c0_pt_done:f32[64,128] = mma_wait(%acc_f_c0_pt, %p16_c0_last_pt) {pending=1}
release() {group='g2', guard=False, lag=1}
%one_c0_pt:f32[64] = full() {value=1.0}
%rl_c0_pt:f32[64] = div0(%one_c0_pt, %l_f_c0_pt)
%rl_col_c0_pt:f32[64,1] = expand(%rl_c0_pt) {axis=1}
%out_f_c0_pt:f32[64,128] = mul(%acc_f_c0_pt_done, %rl_col_c0_pt)
%out_c0_pt:bf16[64,128] = cast(%out_f_c0_pt)
store_ptr(%out_c0_pt) {arg='o', col='(pid_bh_prev%Hq)*o_ch', ld='128+(Hq-1)*o_ch', row='(pid_bh_prev//Hq)*o_rb+(pid_bh_prev%Hq)*o_rh+(cdiv(Sq,128)-1-pid_m_prev)*128', rows_valid='Sq-(cdiv(Sq,128)-1-pid_m_prev)*128'}
%m_fs_c0_pt:f32[64] = mulc(%m_f_c0_pt) {c='qk_scale'}
%lse_v_c0_pt:f32[64] = lse(%m_fs_c0_pt, %l_f_c0_pt)
store_vec(%lse_v_c0_pt) {arg='lse', offset='pid_bh_prev*Sq+(cdiv(Sq,128)-1-pid_m_prev)*128', valid='Sq-(cdiv(Sq,128)-1-pid_m_prev)*128'}
%s_c0_pro_nx_r:f32[64,128] = mma_wait(%s_c0_pro_nx) {pending=0}
release() {group='g0', lag=0}
advance() {group='g0'}
%s_m_c0_pro_nx:f32[64,128] = mask(%s_c0_pro_nx_r) {causal=True, col='(0)*128', kv_len='Skv', row='(cdiv(Sq,128)-1-pid_m)*128'}
%mx_c0_pro_nx:f32[64] = reduce_max(%s_m_c0_pro_nx) {axis=1}
%m0_c0_nx:f32[64] = full() {value='-inf'}
%m_new_c0_pro_nx:f32[64] = max(%m0_c0_nx, %mx_c0_pro_nx)
%m_use_c0_pro_nx:f32[64] = fin0(%m_new_c0_pro_nx)
%dm_raw_c0_pro_nx:f32[64] = sub(%m0_c0_nx, %m_use_c0_pro_nx)
%dm_c0_pro_nx:f32[64] = mulc(%dm_raw_c0_pro_nx) {c='qk_scale'}
%alpha_c0_pro_nx:f32[64] = exp2(%dm_c0_pro_nx)
%m_sc_c0_pro_nx:f32[64] = mulc(%m_use_c0_pro_nx) {c='qk_scale'}
%m_col_c0_pro_nx:f32[64,1] = expand(%m_sc_c0_pro_nx) {axis=1}
%s2_c0_pro_nx:f32[64,128] = mulc(%s_m_c0_pro_nx) {c='qk_scale'}
%sd_c0_pro_nx:f32[64,128] = sub(%s2_c0_pro_nx, %m_col_c0_pro_nx)
%p_c0_pro_nx:f32[64,128] = exp2(%sd_c0_pro_nx)
%ps_c0_pro_nx:f32[64] = reduce_sum(%p_c0_pro_nx) {axis=1}
%l0_c0_nx:f32[64] = full() {value=0.0}
%la_c0_pro_nx:f32[64] = mul(%l0_c0_nx, %alpha_c0_pro_nx)
%l_new_c0_pro_nx:f32[64] = add(%la_c0_pro_nx, %ps_c0_pro_nx)
%a_col_c0_pro_nx:f32[64,1] = expand(%alpha_c0_pro_nx) {axis=1}
%p16_c0_pro_nx:bf16[64,128] = cast(%p_c0_pro_nx)
wait_ready() {group='g2'}
advance() {group='g2'}
%acc0_c0_nx:f32[64,128] = zeros()
%m_f_c0_nx:f32[64], %l_f_c0_nx:f32[64], %acc_f_c0_loop_nx:f32[64,128], %a_col_c0_last_nx:f32[64,1], %p16_c0_last_nx:bf16[64,128] = loop(%m_new_c0_pro_nx, %l_new_c0_pro_nx, %acc0_c0_nx, %a_col_c0_pro_nx, %p16_c0_pro_nx) {iter_args=('m_c0_nx', 'l_c0_nx', 'acc_c0_nx', 'a_col_c0_prev_nx', 'p16_c0_prev_nx'), lb=1, min_trip=1, ub='min(cdiv(Skv,128),cdiv((cdiv(Sq,128)-1-pid_m)*128+128,128))', var='j'} {
yield(%acc_f_c0_loop_nx, %a_col_c0_last_nx, %p16_c0_last_nx, %l_f_c0_nx, %m_f_c0_nx)
""")


def test_off_leaves_every_stage_as_it_was():
    t = _trace("ws_p_128x128_q2_rm_g16", producer_regs=CONFIGS[XT].producer_regs)  # the _xt config's registers
    assert t["cross_tile"] is t["tile_loop"]
    on = _trace()
    assert format_program(on["tile_loop"]).replace(" cross_tile=True", "") == format_program(t["tile_loop"])
    assert parse_program(format_program(on["cross_tile"])) == on["cross_tile"]  # prints and parses back
    producer = on["cross_tile"].partition("producer").body
    assert producer == on["tile_loop"].partition("producer").body  # the producer is untouched


@pytest.mark.parametrize("config,why", [("ws_p_128x128_q2_pp", "ping-pong turns"),
                                        ("ws_p3_192x128_q2_rm_g8", "not one mma after a pipelined loop")])
def test_a_shape_it_does_not_fit_is_a_noted_no_op(config, why):
    t = _trace(config, d=64, cross_tile=True)
    assert [pt.body for pt in t["cross_tile"].partitions] == [pt.body for pt in t["tile_loop"].partitions]
    assert t["cross_tile"].notes[-1].startswith("cross_tile: off: ") and why in t["cross_tile"].notes[-1]


def _mutate(p, fn):
    pt = p.partition("consumer0")
    (tl,) = pt.body
    body = fn(list(tl.body), next(i for i, o in enumerate(tl.body) if o.kind == "tile_next"))
    parts = tuple(replace(x, body=(replace(tl, body=tuple(body)),)) if x.name == pt.name else x for x in p.partitions)
    return replace(p, partitions=parts)


def test_verify_wants_carried_values_defined_on_both_paths():
    p = _trace()["cross_tile"]
    check(p, "cross_tile")

    def stale_read(body, i):  # the step reads a value of the first tile instead of its iter_arg
        nx = body[i]
        its, inits = nx.attr("iter_args"), nx.operands
        step = tuple(replace(o, operands=tuple(inits[its.index(x)] if x in its else x for x in o.operands))
                     for o in nx.body[:-1])
        body[i] = replace(nx, body=(*step, nx.body[-1]))
        return body
    with pytest.raises(VerifyError, match="of the first tile"):
        check(_mutate(p, stale_read), "cross_tile")

    def undefined_yield(body, i):
        nx = body[i]
        y = nx.body[-1]
        body[i] = replace(nx, body=(*nx.body[:-1], replace(y, operands=("nowhere", *y.operands[1:]))))
        return body
    with pytest.raises(VerifyError, match="does not define"):
        check(_mutate(p, undefined_yield), "cross_tile")

    def last_reads_first(body, i):  # tail(last) reads the head's value, not tile_next's result
        nx = body[i]
        lt = {r.name: x for r, x in zip(nx.results, nx.operands)}
        return body[:i + 1] + [replace(o, operands=tuple(lt.get(x, x) for x in o.operands)) for o in body[i + 1:]]
    with pytest.raises(VerifyError, match="from before it"):
        check(_mutate(p, last_reads_first), "cross_tile")


def test_codegen_peels_the_first_tile():
    src = generate(_trace()["cross_tile"])
    c0 = src[src.index("def consumer0("):src.index("def consumer1(")]
    order = ["for tile in range(gl.program_id(0), gl.minimum(gl.program_id(0) + 1, num_tiles)):", "pid_m = first",
             "for tile in range(gl.program_id(0) + gl.num_programs(0), num_tiles, gl.num_programs(0)):",
             "pid_m_prev = pid_m", "pid_m = first",
             # P V(t) issued first, then QK^T(t+1, 0); the first wait retires P V(t) (wgmma groups retire in order)
             "v_acc_f_c0_pt = warpgroup_mma(", "v_s_c0_pro_nx = warpgroup_mma(",
             "v_acc_f_c0_pt_done, _ = warpgroup_mma_wait(num_outstanding=1, deps=(v_acc_f_c0_pt, v_p16_c0_last_pt))",
             "(gl.cdiv(Sq, 128) - 1 - pid_m_prev) * 128",  # tile t's stores, under QK^T(t+1, 0)
             "v_s_c0_pro_nx_r = warpgroup_mma_wait(num_outstanding=0, deps=(v_s_c0_pro_nx,))",
             "gl.exp2(", "for j in range(", "v_acc_f_c0 = warpgroup_mma("]
    pos = 0
    for s in order:
        pos = c0.index(s, pos)
    assert "pid_m_prev" not in src[src.index("def producer("):]
