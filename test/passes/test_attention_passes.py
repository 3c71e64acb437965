"""The attention program through the same passes: before/after IR (d=64, causal, two chains)."""
from __future__ import annotations

from dataclasses import replace

import expecttest
import pytest

from torch_autows.ir import TurnGroup, format_program, parse_program, walk
from torch_autows.passes import PassError, pipeline, software_pipeline
from torch_autows.runtime.attention import CONFIGS
from torch_autows.templates.attention import AttentionRequest, build


def _trace(causal=True, d=64, config="ws_p_128x128"):
    trace = []
    pipeline.run(build(AttentionRequest(d, "bf16", causal), CONFIGS[config]), trace=trace)
    return dict(trace)


def _body(p):
    text = format_program(p)
    return text[text.index("  body {"):text.index("\n  }\n") + 4]


def _lines(p, *prefixes):
    return "\n".join(ln for ln in format_program(p).splitlines() if ln.strip().startswith(prefixes)) + "\n"


class TestAttentionPasses(expecttest.TestCase):
    def test_template(self):
        self.assertExpectedInline(_body(_trace()["template"]), """\
  body {
    %q:bf16[128,64]@smem = load() {arg='q', coords=('(pid_bh//Hq)*q_rb+(pid_bh%Hq)*q_rh+(cdiv(Sq,128)-1-pid_m)*128', '(pid_bh%Hq)*q_ch')}
    %m0:f32[128] = full() {value='-inf'}
    %l0:f32[128] = full() {value=0.0}
    %acc0:f32[128,64] = zeros()
    %m_f:f32[128], %l_f:f32[128], %acc_f:f32[128,64] = loop(%m0, %l0, %acc0) {iter_args=('m', 'l', 'acc'), lb=0, min_trip=1, ub='min(cdiv(Skv,128),cdiv((cdiv(Sq,128)-1-pid_m)*128+128,128))', var='j'} {
      %k:bf16[128,64]@smem = load() {arg='k', coords=('(pid_bh//Hq)*kv_rb+((pid_bh%Hq)//G)*kv_rh+j*128', '((pid_bh%Hq)//G)*kv_ch')}
      %v:bf16[128,64]@smem = load() {arg='v', coords=('(pid_bh//Hq)*kv_rb+((pid_bh%Hq)//G)*kv_rh+j*128', '((pid_bh%Hq)//G)*kv_ch')}
      %kt:bf16[64,128]@smem = trans(%k)
      %s:f32[128,128] = mma(%q, %kt)
      %s2:f32[128,128] = mulc(%s) {c='qk_scale'}
      %s_m:f32[128,128] = mask(%s2) {causal=True, col='j*128', kv_len='Skv', row='(cdiv(Sq,128)-1-pid_m)*128'}
      %mx:f32[128] = reduce_max(%s_m) {axis=1}
      %m_new:f32[128] = max(%m, %mx)
      %m_use:f32[128] = fin0(%m_new)
      %dm:f32[128] = sub(%m, %m_use)
      %alpha:f32[128] = exp2(%dm)
      %m_col:f32[128,1] = expand(%m_use) {axis=1}
      %sd:f32[128,128] = sub(%s_m, %m_col)
      %p:f32[128,128] = exp2(%sd)
      %ps:f32[128] = reduce_sum(%p) {axis=1}
      %la:f32[128] = mul(%l, %alpha)
      %l_new:f32[128] = add(%la, %ps)
      %a_col:f32[128,1] = expand(%alpha) {axis=1}
      %acc_s:f32[128,64] = mul(%acc, %a_col)
      %p16:bf16[128,128] = cast(%p)
      %acc_new:f32[128,64] = mma(%p16, %v, %acc_s)
      yield(%m_new, %l_new, %acc_new)
    }
    %one:f32[128] = full() {value=1.0}
    %rl:f32[128] = div0(%one, %l_f)
    %rl_col:f32[128,1] = expand(%rl) {axis=1}
    %out_f:f32[128,64] = mul(%acc_f, %rl_col)
    %out:bf16[128,64] = cast(%out_f)
    store_ptr(%out) {arg='o', col='(pid_bh%Hq)*o_ch', ld='64+(Hq-1)*o_ch', row='(pid_bh//Hq)*o_rb+(pid_bh%Hq)*o_rh+(cdiv(Sq,128)-1-pid_m)*128', rows_valid='Sq-(cdiv(Sq,128)-1-pid_m)*128'}
    %lse_v:f32[128] = lse(%m_f, %l_f)
    store_vec(%lse_v) {arg='lse', offset='pid_bh*Sq+(cdiv(Sq,128)-1-pid_m)*128', valid='Sq-(cdiv(Sq,128)-1-pid_m)*128'}
  }""")

    def test_data_partition_splits_q_rows_and_shares_k_v(self):
        self.assertExpectedInline(_body(_trace()["data_partition"]), """\
  body {
    %q_c0:bf16[64,64]@smem = load() {arg='q', coords=('(pid_bh//Hq)*q_rb+(pid_bh%Hq)*q_rh+(cdiv(Sq,128)-1-pid_m)*128', '(pid_bh%Hq)*q_ch')} [chain=0]
    %q_c1:bf16[64,64]@smem = load() {arg='q', coords=('(pid_bh//Hq)*q_rb+(pid_bh%Hq)*q_rh+(cdiv(Sq,128)-1-pid_m)*128+64', '(pid_bh%Hq)*q_ch')} [chain=1]
    %m0_c0:f32[64] = full() {value='-inf'} [chain=0]
    %m0_c1:f32[64] = full() {value='-inf'} [chain=1]
    %l0_c0:f32[64] = full() {value=0.0} [chain=0]
    %l0_c1:f32[64] = full() {value=0.0} [chain=1]
    %acc0_c0:f32[64,64] = zeros() [chain=0]
    %acc0_c1:f32[64,64] = zeros() [chain=1]
    %m_f_c0:f32[64], %m_f_c1:f32[64], %l_f_c0:f32[64], %l_f_c1:f32[64], %acc_f_c0:f32[64,64], %acc_f_c1:f32[64,64] = loop(%m0_c0, %m0_c1, %l0_c0, %l0_c1, %acc0_c0, %acc0_c1) {iter_args=('m_c0', 'm_c1', 'l_c0', 'l_c1', 'acc_c0', 'acc_c1'), lb=0, min_trip=1, ub='min(cdiv(Skv,128),cdiv((cdiv(Sq,128)-1-pid_m)*128+128,128))', var='j'} {
      %k:bf16[128,64]@smem = load() {arg='k', coords=('(pid_bh//Hq)*kv_rb+((pid_bh%Hq)//G)*kv_rh+j*128', '((pid_bh%Hq)//G)*kv_ch')}
      %v:bf16[128,64]@smem = load() {arg='v', coords=('(pid_bh//Hq)*kv_rb+((pid_bh%Hq)//G)*kv_rh+j*128', '((pid_bh%Hq)//G)*kv_ch')}
      %kt_c0:bf16[64,128]@smem = trans(%k) [chain=0]
      %kt_c1:bf16[64,128]@smem = trans(%k) [chain=1]
      %s_c0:f32[64,128] = mma(%q_c0, %kt_c0) [chain=0]
      %s_c1:f32[64,128] = mma(%q_c1, %kt_c1) [chain=1]
      %s2_c0:f32[64,128] = mulc(%s_c0) {c='qk_scale'} [chain=0]
      %s2_c1:f32[64,128] = mulc(%s_c1) {c='qk_scale'} [chain=1]
      %s_m_c0:f32[64,128] = mask(%s2_c0) {causal=True, col='j*128', kv_len='Skv', row='(cdiv(Sq,128)-1-pid_m)*128'} [chain=0]
      %s_m_c1:f32[64,128] = mask(%s2_c1) {causal=True, col='j*128', kv_len='Skv', row='(cdiv(Sq,128)-1-pid_m)*128+64'} [chain=1]
      %mx_c0:f32[64] = reduce_max(%s_m_c0) {axis=1} [chain=0]
      %mx_c1:f32[64] = reduce_max(%s_m_c1) {axis=1} [chain=1]
      %m_new_c0:f32[64] = max(%m_c0, %mx_c0) [chain=0]
      %m_new_c1:f32[64] = max(%m_c1, %mx_c1) [chain=1]
      %m_use_c0:f32[64] = fin0(%m_new_c0) [chain=0]
      %m_use_c1:f32[64] = fin0(%m_new_c1) [chain=1]
      %dm_c0:f32[64] = sub(%m_c0, %m_use_c0) [chain=0]
      %dm_c1:f32[64] = sub(%m_c1, %m_use_c1) [chain=1]
      %alpha_c0:f32[64] = exp2(%dm_c0) [chain=0]
      %alpha_c1:f32[64] = exp2(%dm_c1) [chain=1]
      %m_col_c0:f32[64,1] = expand(%m_use_c0) {axis=1} [chain=0]
      %m_col_c1:f32[64,1] = expand(%m_use_c1) {axis=1} [chain=1]
      %sd_c0:f32[64,128] = sub(%s_m_c0, %m_col_c0) [chain=0]
      %sd_c1:f32[64,128] = sub(%s_m_c1, %m_col_c1) [chain=1]
      %p_c0:f32[64,128] = exp2(%sd_c0) [chain=0]
      %p_c1:f32[64,128] = exp2(%sd_c1) [chain=1]
      %ps_c0:f32[64] = reduce_sum(%p_c0) {axis=1} [chain=0]
      %ps_c1:f32[64] = reduce_sum(%p_c1) {axis=1} [chain=1]
      %la_c0:f32[64] = mul(%l_c0, %alpha_c0) [chain=0]
      %la_c1:f32[64] = mul(%l_c1, %alpha_c1) [chain=1]
      %l_new_c0:f32[64] = add(%la_c0, %ps_c0) [chain=0]
      %l_new_c1:f32[64] = add(%la_c1, %ps_c1) [chain=1]
      %a_col_c0:f32[64,1] = expand(%alpha_c0) {axis=1} [chain=0]
      %a_col_c1:f32[64,1] = expand(%alpha_c1) {axis=1} [chain=1]
      %acc_s_c0:f32[64,64] = mul(%acc_c0, %a_col_c0) [chain=0]
      %acc_s_c1:f32[64,64] = mul(%acc_c1, %a_col_c1) [chain=1]
      %p16_c0:bf16[64,128] = cast(%p_c0) [chain=0]
      %p16_c1:bf16[64,128] = cast(%p_c1) [chain=1]
      %acc_new_c0:f32[64,64] = mma(%p16_c0, %v, %acc_s_c0) [chain=0]
      %acc_new_c1:f32[64,64] = mma(%p16_c1, %v, %acc_s_c1) [chain=1]
      yield(%m_new_c0, %m_new_c1, %l_new_c0, %l_new_c1, %acc_new_c0, %acc_new_c1)
    }
    %one_c0:f32[64] = full() {value=1.0} [chain=0]
    %one_c1:f32[64] = full() {value=1.0} [chain=1]
    %rl_c0:f32[64] = div0(%one_c0, %l_f_c0) [chain=0]
    %rl_c1:f32[64] = div0(%one_c1, %l_f_c1) [chain=1]
    %rl_col_c0:f32[64,1] = expand(%rl_c0) {axis=1} [chain=0]
    %rl_col_c1:f32[64,1] = expand(%rl_c1) {axis=1} [chain=1]
    %out_f_c0:f32[64,64] = mul(%acc_f_c0, %rl_col_c0) [chain=0]
    %out_f_c1:f32[64,64] = mul(%acc_f_c1, %rl_col_c1) [chain=1]
    %out_c0:bf16[64,64] = cast(%out_f_c0) [chain=0]
    %out_c1:bf16[64,64] = cast(%out_f_c1) [chain=1]
    store_ptr(%out_c0) {arg='o', col='(pid_bh%Hq)*o_ch', ld='64+(Hq-1)*o_ch', row='(pid_bh//Hq)*o_rb+(pid_bh%Hq)*o_rh+(cdiv(Sq,128)-1-pid_m)*128', rows_valid='Sq-(cdiv(Sq,128)-1-pid_m)*128'} [chain=0]
    store_ptr(%out_c1) {arg='o', col='(pid_bh%Hq)*o_ch', ld='64+(Hq-1)*o_ch', row='(pid_bh//Hq)*o_rb+(pid_bh%Hq)*o_rh+(cdiv(Sq,128)-1-pid_m)*128+64', rows_valid='Sq-(cdiv(Sq,128)-1-pid_m)*128-64'} [chain=1]
    %lse_v_c0:f32[64] = lse(%m_f_c0, %l_f_c0) [chain=0]
    %lse_v_c1:f32[64] = lse(%m_f_c1, %l_f_c1) [chain=1]
    store_vec(%lse_v_c0) {arg='lse', offset='pid_bh*Sq+(cdiv(Sq,128)-1-pid_m)*128', valid='Sq-(cdiv(Sq,128)-1-pid_m)*128'} [chain=0]
    store_vec(%lse_v_c1) {arg='lse', offset='pid_bh*Sq+(cdiv(Sq,128)-1-pid_m)*128+64', valid='Sq-(cdiv(Sq,128)-1-pid_m)*128-64'} [chain=1]
  }""")

    def test_loop_schedule_defers_pv_one_stage(self):
        p = _trace()["loop_schedule"]
        mmas = [(o.results[0].name, o.attr("pending"), o.stage) for o in walk(p.body) if o.kind == "mma"]
        self.assertExpectedInline(repr(mmas), """[('s_c0', 0, 1), ('s_c1', 0, 1), ('acc_new_c0', 0, 2), ('acc_new_c1', 0, 2)]""")

    def test_partitions_buffers_memory_plan(self):
        p = _trace(causal=False, d=128)["ping_pong"]
        self.assertExpectedInline(_lines(p, "partition", "buffer", "channel", "barriers", "turns", "smem", "note"), """\
  partition consumer0 warps=4 regs=232
  partition consumer1 warps=4 regs=232
  partition producer warps=1 regs=40
  buffer q_c0_smem: bf16[64,128]@smem value=%q_c0 count=1 offset=196608
  buffer q_c1_smem: bf16[64,128]@smem value=%q_c1 count=1 offset=212992
  buffer k_smem: bf16[128,128]@smem value=%k count=3 offset=0
  buffer v_smem: bf16[128,128]@smem value=%v count=3 offset=98304
  channel ch_k: %k producer -> consumer0,consumer1 buffer=k_smem group=g0
  channel ch_q_c0: %q_c0 producer -> consumer0 buffer=q_c0_smem group=g1
  channel ch_q_c1: %q_c1 producer -> consumer1 buffer=q_c1_smem group=g1
  channel ch_v: %v producer -> consumer0,consumer1 buffer=v_smem group=g0
  barriers g0: count=3 arrivals=2 bytes=65536 channels=ch_k,ch_v
  barriers g1: count=1 arrivals=2 bytes=32768 channels=ch_q_c0,ch_q_c1
  smem 229440
  note 'memory_plan: ring depth 4 -> 3 to fit 232448 B of SMEM'
  note 'ping_pong: off: consumer0, consumer1 issue wgmma independently'
""")

    def test_software_pipeline_waits_q_once_per_tile(self):
        p = _trace()["software_pipeline"]
        text = format_program(p)
        self.assertExpectedInline(text[text.index("  code consumer0"):], """\
  code consumer0 {
    %m0_c0:f32[64] = full() {value='-inf'} [chain=0 partition=consumer0]
    %l0_c0:f32[64] = full() {value=0.0} [chain=0 partition=consumer0]
    %acc0_c0:f32[64,64] = zeros() [chain=0 partition=consumer0]
    wait_ready() {group='g1'}
    %q_c0:bf16[64,64]@smem = get() {buffer='q_c0_smem', group='g1'}
    wait_ready() {group='g0'}
    %k_pro:bf16[128,64]@smem = get() {buffer='k_smem', group='g0'}
    %kt_c0_pro:bf16[64,128]@smem = trans(%k_pro) [chain=0 partition=consumer0 stage=1 order=2]
    %s_c0_pro:f32[64,128] = mma(%q_c0, %kt_c0_pro) {pending=0} [chain=0 partition=consumer0 stage=1 order=4]
    %s2_c0_pro:f32[64,128] = mulc(%s_c0_pro) {c='qk_scale'} [chain=0 partition=consumer0 stage=1 order=6]
    %s_m_c0_pro:f32[64,128] = mask(%s2_c0_pro) {causal=True, col='(0)*128', kv_len='Skv', row='(cdiv(Sq,128)-1-pid_m)*128'} [chain=0 partition=consumer0 stage=1 order=8]
    %mx_c0_pro:f32[64] = reduce_max(%s_m_c0_pro) {axis=1} [chain=0 partition=consumer0 stage=1 order=10]
    %m_new_c0_pro:f32[64] = max(%m0_c0, %mx_c0_pro) [chain=0 partition=consumer0 stage=1 order=12]
    %m_use_c0_pro:f32[64] = fin0(%m_new_c0_pro) [chain=0 partition=consumer0 stage=1 order=14]
    %dm_c0_pro:f32[64] = sub(%m0_c0, %m_use_c0_pro) [chain=0 partition=consumer0 stage=1 order=16]
    %alpha_c0_pro:f32[64] = exp2(%dm_c0_pro) [chain=0 partition=consumer0 stage=1 order=18]
    %m_col_c0_pro:f32[64,1] = expand(%m_use_c0_pro) {axis=1} [chain=0 partition=consumer0 stage=1 order=20]
    %sd_c0_pro:f32[64,128] = sub(%s_m_c0_pro, %m_col_c0_pro) [chain=0 partition=consumer0 stage=1 order=22]
    %p_c0_pro:f32[64,128] = exp2(%sd_c0_pro) [chain=0 partition=consumer0 stage=1 order=24]
    %ps_c0_pro:f32[64] = reduce_sum(%p_c0_pro) {axis=1} [chain=0 partition=consumer0 stage=1 order=26]
    %la_c0_pro:f32[64] = mul(%l0_c0, %alpha_c0_pro) [chain=0 partition=consumer0 stage=1 order=28]
    %l_new_c0_pro:f32[64] = add(%la_c0_pro, %ps_c0_pro) [chain=0 partition=consumer0 stage=1 order=30]
    %a_col_c0_pro:f32[64,1] = expand(%alpha_c0_pro) {axis=1} [chain=0 partition=consumer0 stage=1 order=32]
    %p16_c0_pro:bf16[64,128] = cast(%p_c0_pro) [chain=0 partition=consumer0 stage=1 order=34]
    advance() {group='g0'}
    %m_f_c0:f32[64], %l_f_c0:f32[64], %acc_f_c0_loop:f32[64,64], %a_col_c0_last:f32[64,1], %p16_c0_last:bf16[64,128] = loop(%m_new_c0_pro, %l_new_c0_pro, %acc0_c0, %a_col_c0_pro, %p16_c0_pro) {iter_args=('m_c0', 'l_c0', 'acc_c0', 'a_col_c0_prev', 'p16_c0_prev'), lb=1, min_trip=1, ub='min(cdiv(Skv,128),cdiv((cdiv(Sq,128)-1-pid_m)*128+128,128))', var='j'} {
      wait_ready() {group='g0'}
      %k:bf16[128,64]@smem = get() {buffer='k_smem', group='g0'}
      %kt_c0:bf16[64,128]@smem = trans(%k) [chain=0 partition=consumer0 stage=1 order=2]
      %s_c0:f32[64,128] = mma(%q_c0, %kt_c0) {pending=0, wait=False} [chain=0 partition=consumer0 stage=1 order=4]
      %v_prev:bf16[128,64]@smem = get() {buffer='v_smem', group='g0', lag=1}
      %acc_s_c0:f32[64,64] = mul(%acc_c0, %a_col_c0_prev) [chain=0 partition=consumer0 stage=2 order=36]
      %acc_new_c0:f32[64,64] = mma(%p16_c0_prev, %v_prev, %acc_s_c0) {pending=0, wait=False} [chain=0 partition=consumer0 stage=2 order=38]
      %s_c0_r:f32[64,128] = mma_wait(%s_c0) {pending=1}
      %s2_c0:f32[64,128] = mulc(%s_c0_r) {c='qk_scale'} [chain=0 partition=consumer0 stage=1 order=6]
      %s_m_c0:f32[64,128] = mask(%s2_c0) {causal=True, col='j*128', kv_len='Skv', row='(cdiv(Sq,128)-1-pid_m)*128'} [chain=0 partition=consumer0 stage=1 order=8]
      %mx_c0:f32[64] = reduce_max(%s_m_c0) {axis=1} [chain=0 partition=consumer0 stage=1 order=10]
      %m_new_c0:f32[64] = max(%m_c0, %mx_c0) [chain=0 partition=consumer0 stage=1 order=12]
      %m_use_c0:f32[64] = fin0(%m_new_c0) [chain=0 partition=consumer0 stage=1 order=14]
      %dm_c0:f32[64] = sub(%m_c0, %m_use_c0) [chain=0 partition=consumer0 stage=1 order=16]
      %alpha_c0:f32[64] = exp2(%dm_c0) [chain=0 partition=consumer0 stage=1 order=18]
      %m_col_c0:f32[64,1] = expand(%m_use_c0) {axis=1} [chain=0 partition=consumer0 stage=1 order=20]
      %sd_c0:f32[64,128] = sub(%s_m_c0, %m_col_c0) [chain=0 partition=consumer0 stage=1 order=22]
      %p_c0:f32[64,128] = exp2(%sd_c0) [chain=0 partition=consumer0 stage=1 order=24]
      %ps_c0:f32[64] = reduce_sum(%p_c0) {axis=1} [chain=0 partition=consumer0 stage=1 order=26]
      %la_c0:f32[64] = mul(%l_c0, %alpha_c0) [chain=0 partition=consumer0 stage=1 order=28]
      %l_new_c0:f32[64] = add(%la_c0, %ps_c0) [chain=0 partition=consumer0 stage=1 order=30]
      %a_col_c0:f32[64,1] = expand(%alpha_c0) {axis=1} [chain=0 partition=consumer0 stage=1 order=32]
      %p16_c0:bf16[64,128] = cast(%p_c0) [chain=0 partition=consumer0 stage=1 order=34]
      %acc_new_c0_done:f32[64,64] = mma_wait(%acc_new_c0, %p16_c0_prev) {pending=0}
      release() {group='g0', guard=False, lag=1}
      advance() {group='g0'}
      yield(%m_new_c0, %l_new_c0, %acc_new_c0_done, %a_col_c0, %p16_c0)
    }
    %v_epi:bf16[128,64]@smem = get() {buffer='v_smem', group='g0', lag=1}
    %acc_s_c0_epi:f32[64,64] = mul(%acc_f_c0_loop, %a_col_c0_last) [chain=0 partition=consumer0 stage=2 order=36]
    %acc_f_c0:f32[64,64] = mma(%p16_c0_last, %v_epi, %acc_s_c0_epi) {pending=0} [chain=0 partition=consumer0 stage=2 order=38]
    release() {group='g0', guard=False, lag=1}
    release() {group='g1', lag=0}
    advance() {group='g1'}
    %one_c0:f32[64] = full() {value=1.0} [chain=0 partition=consumer0]
    %rl_c0:f32[64] = div0(%one_c0, %l_f_c0) [chain=0 partition=consumer0]
    %rl_col_c0:f32[64,1] = expand(%rl_c0) {axis=1} [chain=0 partition=consumer0]
    %out_f_c0:f32[64,64] = mul(%acc_f_c0, %rl_col_c0) [chain=0 partition=consumer0]
    %out_c0:bf16[64,64] = cast(%out_f_c0) [chain=0 partition=consumer0]
    store_ptr(%out_c0) {arg='o', col='(pid_bh%Hq)*o_ch', ld='64+(Hq-1)*o_ch', row='(pid_bh//Hq)*o_rb+(pid_bh%Hq)*o_rh+(cdiv(Sq,128)-1-pid_m)*128', rows_valid='Sq-(cdiv(Sq,128)-1-pid_m)*128'} [chain=0 partition=consumer0]
    %lse_v_c0:f32[64] = lse(%m_f_c0, %l_f_c0) [chain=0 partition=consumer0]
    store_vec(%lse_v_c0) {arg='lse', offset='pid_bh*Sq+(cdiv(Sq,128)-1-pid_m)*128', valid='Sq-(cdiv(Sq,128)-1-pid_m)*128'} [chain=0 partition=consumer0]
  }
  code consumer1 {
    %m0_c1:f32[64] = full() {value='-inf'} [chain=1 partition=consumer1]
    %l0_c1:f32[64] = full() {value=0.0} [chain=1 partition=consumer1]
    %acc0_c1:f32[64,64] = zeros() [chain=1 partition=consumer1]
    wait_ready() {group='g1'}
    %q_c1:bf16[64,64]@smem = get() {buffer='q_c1_smem', group='g1'}
    wait_ready() {group='g0'}
    %k_pro:bf16[128,64]@smem = get() {buffer='k_smem', group='g0'}
    %kt_c1_pro:bf16[64,128]@smem = trans(%k_pro) [chain=1 partition=consumer1 stage=1 order=3]
    %s_c1_pro:f32[64,128] = mma(%q_c1, %kt_c1_pro) {pending=0} [chain=1 partition=consumer1 stage=1 order=5]
    %s2_c1_pro:f32[64,128] = mulc(%s_c1_pro) {c='qk_scale'} [chain=1 partition=consumer1 stage=1 order=7]
    %s_m_c1_pro:f32[64,128] = mask(%s2_c1_pro) {causal=True, col='(0)*128', kv_len='Skv', row='(cdiv(Sq,128)-1-pid_m)*128+64'} [chain=1 partition=consumer1 stage=1 order=9]
    %mx_c1_pro:f32[64] = reduce_max(%s_m_c1_pro) {axis=1} [chain=1 partition=consumer1 stage=1 order=11]
    %m_new_c1_pro:f32[64] = max(%m0_c1, %mx_c1_pro) [chain=1 partition=consumer1 stage=1 order=13]
    %m_use_c1_pro:f32[64] = fin0(%m_new_c1_pro) [chain=1 partition=consumer1 stage=1 order=15]
    %dm_c1_pro:f32[64] = sub(%m0_c1, %m_use_c1_pro) [chain=1 partition=consumer1 stage=1 order=17]
    %alpha_c1_pro:f32[64] = exp2(%dm_c1_pro) [chain=1 partition=consumer1 stage=1 order=19]
    %m_col_c1_pro:f32[64,1] = expand(%m_use_c1_pro) {axis=1} [chain=1 partition=consumer1 stage=1 order=21]
    %sd_c1_pro:f32[64,128] = sub(%s_m_c1_pro, %m_col_c1_pro) [chain=1 partition=consumer1 stage=1 order=23]
    %p_c1_pro:f32[64,128] = exp2(%sd_c1_pro) [chain=1 partition=consumer1 stage=1 order=25]
    %ps_c1_pro:f32[64] = reduce_sum(%p_c1_pro) {axis=1} [chain=1 partition=consumer1 stage=1 order=27]
    %la_c1_pro:f32[64] = mul(%l0_c1, %alpha_c1_pro) [chain=1 partition=consumer1 stage=1 order=29]
    %l_new_c1_pro:f32[64] = add(%la_c1_pro, %ps_c1_pro) [chain=1 partition=consumer1 stage=1 order=31]
    %a_col_c1_pro:f32[64,1] = expand(%alpha_c1_pro) {axis=1} [chain=1 partition=consumer1 stage=1 order=33]
    %p16_c1_pro:bf16[64,128] = cast(%p_c1_pro) [chain=1 partition=consumer1 stage=1 order=35]
    advance() {group='g0'}
    %m_f_c1:f32[64], %l_f_c1:f32[64], %acc_f_c1_loop:f32[64,64], %a_col_c1_last:f32[64,1], %p16_c1_last:bf16[64,128] = loop(%m_new_c1_pro, %l_new_c1_pro, %acc0_c1, %a_col_c1_pro, %p16_c1_pro) {iter_args=('m_c1', 'l_c1', 'acc_c1', 'a_col_c1_prev', 'p16_c1_prev'), lb=1, min_trip=1, ub='min(cdiv(Skv,128),cdiv((cdiv(Sq,128)-1-pid_m)*128+128,128))', var='j'} {
      wait_ready() {group='g0'}
      %k:bf16[128,64]@smem = get() {buffer='k_smem', group='g0'}
      %kt_c1:bf16[64,128]@smem = trans(%k) [chain=1 partition=consumer1 stage=1 order=3]
      %s_c1:f32[64,128] = mma(%q_c1, %kt_c1) {pending=0, wait=False} [chain=1 partition=consumer1 stage=1 order=5]
      %v_prev:bf16[128,64]@smem = get() {buffer='v_smem', group='g0', lag=1}
      %acc_s_c1:f32[64,64] = mul(%acc_c1, %a_col_c1_prev) [chain=1 partition=consumer1 stage=2 order=37]
      %acc_new_c1:f32[64,64] = mma(%p16_c1_prev, %v_prev, %acc_s_c1) {pending=0, wait=False} [chain=1 partition=consumer1 stage=2 order=39]
      %s_c1_r:f32[64,128] = mma_wait(%s_c1) {pending=1}
      %s2_c1:f32[64,128] = mulc(%s_c1_r) {c='qk_scale'} [chain=1 partition=consumer1 stage=1 order=7]
      %s_m_c1:f32[64,128] = mask(%s2_c1) {causal=True, col='j*128', kv_len='Skv', row='(cdiv(Sq,128)-1-pid_m)*128+64'} [chain=1 partition=consumer1 stage=1 order=9]
      %mx_c1:f32[64] = reduce_max(%s_m_c1) {axis=1} [chain=1 partition=consumer1 stage=1 order=11]
      %m_new_c1:f32[64] = max(%m_c1, %mx_c1) [chain=1 partition=consumer1 stage=1 order=13]
      %m_use_c1:f32[64] = fin0(%m_new_c1) [chain=1 partition=consumer1 stage=1 order=15]
      %dm_c1:f32[64] = sub(%m_c1, %m_use_c1) [chain=1 partition=consumer1 stage=1 order=17]
      %alpha_c1:f32[64] = exp2(%dm_c1) [chain=1 partition=consumer1 stage=1 order=19]
      %m_col_c1:f32[64,1] = expand(%m_use_c1) {axis=1} [chain=1 partition=consumer1 stage=1 order=21]
      %sd_c1:f32[64,128] = sub(%s_m_c1, %m_col_c1) [chain=1 partition=consumer1 stage=1 order=23]
      %p_c1:f32[64,128] = exp2(%sd_c1) [chain=1 partition=consumer1 stage=1 order=25]
      %ps_c1:f32[64] = reduce_sum(%p_c1) {axis=1} [chain=1 partition=consumer1 stage=1 order=27]
      %la_c1:f32[64] = mul(%l_c1, %alpha_c1) [chain=1 partition=consumer1 stage=1 order=29]
      %l_new_c1:f32[64] = add(%la_c1, %ps_c1) [chain=1 partition=consumer1 stage=1 order=31]
      %a_col_c1:f32[64,1] = expand(%alpha_c1) {axis=1} [chain=1 partition=consumer1 stage=1 order=33]
      %p16_c1:bf16[64,128] = cast(%p_c1) [chain=1 partition=consumer1 stage=1 order=35]
      %acc_new_c1_done:f32[64,64] = mma_wait(%acc_new_c1, %p16_c1_prev) {pending=0}
      release() {group='g0', guard=False, lag=1}
      advance() {group='g0'}
      yield(%m_new_c1, %l_new_c1, %acc_new_c1_done, %a_col_c1, %p16_c1)
    }
    %v_epi:bf16[128,64]@smem = get() {buffer='v_smem', group='g0', lag=1}
    %acc_s_c1_epi:f32[64,64] = mul(%acc_f_c1_loop, %a_col_c1_last) [chain=1 partition=consumer1 stage=2 order=37]
    %acc_f_c1:f32[64,64] = mma(%p16_c1_last, %v_epi, %acc_s_c1_epi) {pending=0} [chain=1 partition=consumer1 stage=2 order=39]
    release() {group='g0', guard=False, lag=1}
    release() {group='g1', lag=0}
    advance() {group='g1'}
    %one_c1:f32[64] = full() {value=1.0} [chain=1 partition=consumer1]
    %rl_c1:f32[64] = div0(%one_c1, %l_f_c1) [chain=1 partition=consumer1]
    %rl_col_c1:f32[64,1] = expand(%rl_c1) {axis=1} [chain=1 partition=consumer1]
    %out_f_c1:f32[64,64] = mul(%acc_f_c1, %rl_col_c1) [chain=1 partition=consumer1]
    %out_c1:bf16[64,64] = cast(%out_f_c1) [chain=1 partition=consumer1]
    store_ptr(%out_c1) {arg='o', col='(pid_bh%Hq)*o_ch', ld='64+(Hq-1)*o_ch', row='(pid_bh//Hq)*o_rb+(pid_bh%Hq)*o_rh+(cdiv(Sq,128)-1-pid_m)*128+64', rows_valid='Sq-(cdiv(Sq,128)-1-pid_m)*128-64'} [chain=1 partition=consumer1]
    %lse_v_c1:f32[64] = lse(%m_f_c1, %l_f_c1) [chain=1 partition=consumer1]
    store_vec(%lse_v_c1) {arg='lse', offset='pid_bh*Sq+(cdiv(Sq,128)-1-pid_m)*128+64', valid='Sq-(cdiv(Sq,128)-1-pid_m)*128-64'} [chain=1 partition=consumer1]
  }
  code producer {
    acquire() {group='g1'}
    %q_c0:bf16[64,64]@smem = load() {arg='q', buffer='q_c0_smem', coords=('(pid_bh//Hq)*q_rb+(pid_bh%Hq)*q_rh+(cdiv(Sq,128)-1-pid_m)*128', '(pid_bh%Hq)*q_ch'), group='g1'} [chain=0 partition=producer]
    %q_c1:bf16[64,64]@smem = load() {arg='q', buffer='q_c1_smem', coords=('(pid_bh//Hq)*q_rb+(pid_bh%Hq)*q_rh+(cdiv(Sq,128)-1-pid_m)*128+64', '(pid_bh%Hq)*q_ch'), group='g1'} [chain=1 partition=producer]
    advance() {group='g1'}
    loop() {iter_args=(), lb=0, min_trip=1, ub='min(cdiv(Skv,128),cdiv((cdiv(Sq,128)-1-pid_m)*128+128,128))', var='j'} {
      acquire() {group='g0'}
      %k:bf16[128,64]@smem = load() {arg='k', buffer='k_smem', coords=('(pid_bh//Hq)*kv_rb+((pid_bh%Hq)//G)*kv_rh+j*128', '((pid_bh%Hq)//G)*kv_ch'), group='g0'} [partition=producer stage=0 order=0]
      %v:bf16[128,64]@smem = load() {arg='v', buffer='v_smem', coords=('(pid_bh//Hq)*kv_rb+((pid_bh%Hq)//G)*kv_rh+j*128', '((pid_bh%Hq)//G)*kv_ch'), group='g0'} [partition=producer stage=0 order=1]
      advance() {group='g0'}
      yield()
    }
  }
""")


def test_round_trip_every_step():
    for causal in (False, True):
        for name, p in _trace(causal).items():
            assert parse_program(format_program(p)) == p, name


def _loop(p, part="consumer0"):
    return next(o for o in p.partition(part).body if o.kind == "loop")


def test_code_partition_lowers_the_deferred_loop_in_step_order():
    """code_partition leaves the loop whose P V loop_schedule deferred as it is (each step's ops in order, V
    got and released in its own step); software_pipeline then makes the prologue/steady/epilogue of it."""
    trace = _trace()
    lowered, piped = trace["code_partition"], trace["software_pipeline"]
    loop = _loop(lowered)
    assert {o.stage for o in loop.body if o.stage is not None} == {1, 2}
    assert loop.attr("lb") == 0 and not any(o.attr("lag") for o in walk(loop.body))
    assert _loop(piped).attr("lb") == 1 and any(o.kind == "get" and o.attr("lag") == 1 for o in _loop(piped).body)
    assert software_pipeline.run(lowered) == piped


def test_software_pipeline_refuses_async_wgmma_across_steps():
    """A deferred loop whose mma stays in flight across steps (its slots released ``lag`` steps late) cannot be
    pipelined as it is: the pass says so instead of leaving the slots unreleased."""
    lowered = _trace()["code_partition"]
    held = lowered.partition("consumer0")
    body = tuple(replace(o, body=tuple(x.with_attrs(pending=1) if x.kind == "mma" and x.stage == 1 else x
                                       for x in o.body)) if o.kind == "loop" else o for o in held.body)
    bad = replace(lowered, partitions=tuple(replace(pt, body=body) if pt is held else pt for pt in lowered.partitions))
    with pytest.raises(PassError, match="keeps async wgmma in flight"):
        software_pipeline.run(bad)


class TestPingPong(expecttest.TestCase):
    def test_turns_are_a_barrier_record(self):
        """ping_pong puts the turn barriers on the Program (printed as a ``turns`` line) and counts their bytes."""
        trace = _trace(causal=False, d=128, config="ws_p_128x128_q2_pp")
        before, after = trace["software_pipeline"], trace["ping_pong"]
        assert before.turns is None and after.turns == TurnGroup("turn_bar", ("consumer0", "consumer1"))
        assert after.smem_bytes == before.smem_bytes + 16
        self.assertExpectedInline(_lines(after, "barriers", "turns", "smem", "note"), """\
  barriers g0: count=2 arrivals=2 bytes=32768 channels=ch_k
  barriers g1: count=2 arrivals=2 bytes=32768 channels=ch_q_c0,ch_q_c1
  barriers g2: count=3 arrivals=2 bytes=32768 channels=ch_v
  turns turn_bar: partitions=consumer0,consumer1 bytes=16
  smem 229504
  note 'memory_plan: rings held fewer steps made shallower (k_smem 2, v_smem 3) to fit'
  note 'memory_plan: ring depth 4 -> 3 to fit 232448 B of SMEM'
  note 'ping_pong: consumer0, consumer1 take turns issuing wgmma'
""")
