"""The generated attention backward's runtime on CPU (runtime/attention_bwd.py, passes/BACKWARD.md step 7): its support
reasons (fake CUDA tensors on a patched sm_90), the ``config.attention_backward`` option, and the wiring in
``attention_grad.attention_backward``: "autows" tries the generated backward first and falls back to the vendor's
path with the reason logged once; "vendor" (the default) never calls it."""
from __future__ import annotations

import logging

import pytest
import torch
from programs import fake_cuda
from torch._subclasses.fake_tensor import FakeTensorMode

from torch_autows import attention_grad, config
from torch_autows.runtime import attention_bwd, attention_bwd_configs, device, fallback
from torch_autows.runtime.fallback import Unsupported


@pytest.fixture
def sm90(monkeypatch):
    monkeypatch.setattr(device, "capability", lambda idx: (9, 0))
    return monkeypatch


@pytest.fixture(autouse=True)
def _fresh():
    fallback.reset()
    yield
    fallback.reset()


def _call(d=64, hq=8, hkv=2, sq=100, skv=70, dtype=torch.bfloat16, **change):
    """(q, k, v, out, lse, grad_out) as fake CUDA tensors, any replaced by ``change``."""
    t = {"q": fake_cuda(2, hq, sq, d, dtype=dtype), "k": fake_cuda(2, hkv, skv, d, dtype=dtype),
         "v": fake_cuda(2, hkv, skv, d, dtype=dtype), "out": fake_cuda(2, hq, sq, d, dtype=dtype),
         "lse": fake_cuda(2, hq, sq, dtype=torch.float32), "grad_out": fake_cuda(2, hq, sq, d, dtype=dtype)}
    t.update(change)
    return t["q"], t["k"], t["v"], t["out"], t["lse"], t["grad_out"]


def test_served_calls(sm90):
    for d in (64, 128):
        for dt in (torch.bfloat16, torch.float16):
            assert attention_bwd.support_reason(*_call(d, dtype=dt), True, 0.1) is None
    assert attention_bwd.support_reason(*_call(hkv=8), False, 0.1) is None
    q, k, v, out, lse, _ = _call()
    assert attention_bwd.support_reason(q, k, v, out, lse, None, False, 0.1) is None  # only a gradient into lse


@pytest.mark.parametrize("change,reason", [
    (dict(dtype=torch.float32), "takes bfloat16 or float16"),
    (dict(d=96), "head_dim 96"),
    (dict(d=256), "head_dim 256"),
    (dict(hq=6, hkv=4), "multiple of Hkv"),
    (dict(sq=0), "empty"),
])
def test_reasons(sm90, change, reason):
    assert reason in attention_bwd.support_reason(*_call(**change), False, 0.1)


def test_mixed_dtypes_and_shapes_are_refused(sm90):
    why = attention_bwd.support_reason(*_call(grad_out=fake_cuda(2, 8, 100, 64, dtype=torch.float16)), False, 0.1)
    assert "differ in dtype" in why
    assert "lse" in attention_bwd.support_reason(*_call(lse=fake_cuda(2, 8, 99, dtype=torch.float32)), False, 0.1)


@pytest.fixture
def deterministic():
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(before)


def test_deterministic_mode_takes_the_separate_form(sm90, deterministic):
    """Deterministic algorithms: the call is served (no refusal), by the separate dQ kernel; forcing the atomic form
    is refused with what to use instead."""
    assert attention_bwd.support_reason(*_call(), False, 0.1) is None
    assert attention_bwd.choose_dq_mode() == "separate" and attention_bwd.choose_dq_mode("separate") == "separate"
    assert attention_bwd.choose_dq_mode(None, 64) == "separate"  # not d=64's default "reduce"
    with pytest.raises(Unsupported, match="atomic dQ is not deterministic.*dq_mode='separate' is"):
        attention_bwd.choose_dq_mode("atomic")
    with pytest.raises(Unsupported, match="reduce dQ is not deterministic .*TMA reduce-adds.*dq_mode='separate' is"):
        attention_bwd.choose_dq_mode("reduce")


def test_dq_mode_choice_and_configs(monkeypatch):
    assert not torch.are_deterministic_algorithms_enabled()
    assert attention_bwd.choose_dq_mode() == "separate" and attention_bwd.choose_dq_mode("atomic") == "atomic"
    assert attention_bwd.choose_dq_mode("reduce") == "reduce"
    assert attention_bwd.choose_dq_mode("separate", 64) == "separate"
    # the measured default per head dim, mask and keys: reduce ahead of separate at d=64 from 1024 keys
    # (sweeps/...-attention-bwd-configs-7; without the mask with two CTAs an SM, -bwd-c2), at d=128 from 2048
    # (-configs-6), from 1024 where the KV tiles are whole (dK/dV by TMA: -store-in-ring); other head dims: separate
    for causal in (False, True):
        assert [attention_bwd.choose_dq_mode(None, d, 1024, causal) for d in (64, 128)] == ["reduce", "reduce"]
        assert [attention_bwd.choose_dq_mode(None, d, 1023, causal) for d in (64, 128)] == ["separate", "separate"]
        assert [attention_bwd.choose_dq_mode(None, d, 1152, causal) for d in (64, 128)] == ["reduce", "reduce"]
        assert [attention_bwd.choose_dq_mode(None, d, 1100, causal) for d in (64, 128)] == ["reduce", "separate"]
        assert [attention_bwd.choose_dq_mode(None, d, 2048, causal) for d in (64, 128)] == ["reduce", "reduce"]
        assert attention_bwd.choose_dq_mode(None, 128, 512, causal) == "separate"
        assert attention_bwd.choose_dq_mode(None, 64, None, causal) == "reduce"  # keys unknown: as for many
    assert attention_bwd.choose_dq_mode(None, 64, 1023) == "separate"
    assert attention_bwd.choose_dq_mode(None, 128, 2047) == "separate" and attention_bwd.choose_dq_mode(None, 96) == (
        "separate")
    with pytest.raises(ValueError, match="dq_mode='fast'; use one of"):
        attention_bwd.choose_dq_mode("fast")
    for d in (64, 128):
        for causal in (False, True):
            for mode in attention_bwd.DQ_MODES:
                for keys in (None, 1, 512, 1024, 4096):
                    assert attention_bwd.serves(attention_bwd.choose_config(d, causal, mode, keys), d, mode)
            assert attention_bwd.dq_serves(attention_bwd.choose_dq_config(d, causal), d)
    # d=64's reduce form: two CTAs an SM with K and V in registers (REDUCE_PICKS) up to REDUCE_LONG's keys, then
    # 128-query steps with dQ split by query rows; not (yet) the separate form
    c2, long = "bwd_64x64_dp1_c2_kvr", "bwd_128x128_dp2_dqsplit_fold_sr"
    assert attention_bwd.CONFIGS[c2].ctas_per_sm == 2 and attention_bwd.CONFIGS[c2].early_reduce_wait
    assert attention_bwd.CONFIGS[c2].kv_regs and not attention_bwd.serves(c2, 64, "separate")
    o = attention_bwd.CONFIGS[long]
    assert (o.block_m, o.block_n, o.data_partition, o.dq_split) == (128, 128, 2, True)
    for causal in (False, True):
        start = attention_bwd.REDUCE_LONG[64, causal][1]
        assert {attention_bwd.choose_config(64, causal, "reduce", keys) for keys in (1, 512, start - 1, None)} == {c2}
        assert {attention_bwd.choose_config(64, causal, "reduce", keys) for keys in (start, 8192)} == {long}
        assert attention_bwd.choose_config(128, causal, "reduce", 8192) == "bwd_64x128_dp2_dqsplit_fold_sr"
    assert all(attention_bwd.choose_config(64, causal, "separate", 512) != c2 for causal in (False, True))
    assert attention_bwd.choose_config(64, True) != c2 and attention_bwd.choose_config(64, True, "atomic") != c2
    assert all(attention_bwd.choose_config(128, causal, mode, 512) != c2 for causal in (False, True)
               for mode in attention_bwd.DQ_MODES)
    # d=128's two-CTA twin (folded: no spills at d=128): served in the separate form, not picked (SHORT)
    c2f = "bwd_64x64_dp1_c2_fold"
    assert attention_bwd.CONFIGS[c2f].ctas_per_sm == 2 and attention_bwd.CONFIGS[c2f].fold_rows
    assert attention_bwd.serves(c2f, 128) and not attention_bwd.serves(c2f, 64)
    assert not attention_bwd.serves(c2f, 128, "reduce")
    monkeypatch.setattr(attention_bwd_configs, "SHORT", {("separate", 128, True): (c2f, 1024)})
    assert [attention_bwd.choose_config(128, True, "separate", keys) for keys in (1, 512, 1024, 1025, None)] == [
        c2f, c2f, c2f, "bwd_64x128_dp2", "bwd_64x128_dp2"]
    assert attention_bwd.choose_config(128, False, "separate", 512) == "bwd_64x128_dp2"
    assert attention_bwd.choose_config(128, True, "reduce", 512) == "bwd_64x128_dp2_dqsplit_fold_sr"
    assert not attention_bwd.serves("bwd_32x128_dp2", 128, "atomic")  # dQ's wgmma would have 32 rows
    # d=128 reduce: the split dQ only (the whole dQ^T partial sums spill); the separate form keeps plain options
    assert [c for c in attention_bwd.CONFIGS if attention_bwd.serves(c, 128, "reduce")] == [
        "bwd_64x128_dp2_dqsplit_fold", "bwd_32x128_dp2_dqsplit", "bwd_64x128_dp2_dqsplit_fold_sr"]
    configs = attention_bwd.CONFIGS
    assert configs["bwd_32x128_dp2_dqsplit"].dq_split and not configs["bwd_32x128_dp2"].dq_split
    # the 64-query split with the folded rows: 1.13-1.17x the 32-query split (-configs-6); dK/dV by TMA out of the
    # Q/dO ring (-store-in-ring)
    assert attention_bwd.choose_config(128, True, "reduce") == "bwd_64x128_dp2_dqsplit_fold_sr"


def test_not_sm90_or_not_cuda(monkeypatch):
    monkeypatch.setattr(device, "capability", lambda idx: (8, 0))
    assert "sm_90" in attention_bwd.support_reason(*_call(), False, 0.1)
    q = torch.randn(1, 2, 8, 64, dtype=torch.bfloat16)
    assert "tensors on cpu" in attention_bwd.support_reason(q, q, q, q, q[..., 0].float(), q, False, 0.1)
    with pytest.raises(Unsupported, match="tensors on cpu"):
        attention_bwd.backward(q, None, q, q, q, q, q[..., 0].float(), False, 0.1)


def test_option_is_validated(monkeypatch):
    assert config.attention_backward == "measure"
    with pytest.raises(ValueError, match="attention_backward must be one of 'vendor', 'autows', 'measure'"):
        config.patch(attention_backward="cudnn")
    with config.patch(attention_backward="autows"):
        assert config.snapshot()["attention_backward"] == "autows"
    assert config.attention_backward == "measure"
    assert config.env_choice("X", "vendor", config.BACKWARD_CHOICES, {"X": " AutoWS "}) == "autows"
    with pytest.raises(ValueError, match="X='fast' is not one of vendor, autows, measure"):
        config.env_choice("X", "vendor", config.BACKWARD_CHOICES, {"X": "fast"})
    assert "TORCH_AUTOWS_ATTENTION_BACKWARD" in config.ENV_VARS


def _cpu_inputs(seed=0, hq=4, hkv=2):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, hq, 9, 64, generator=g)
    k, v = (torch.randn(1, hkv, 7, 64, generator=g) for _ in range(2))
    out, lse = attention_grad.reference_attention(q, k, v, False, 0.125)
    return torch.randn(1, hq, 9, 64, generator=g), q, k, v, out, lse


def test_vendor_never_calls_the_generated_backward(monkeypatch):
    monkeypatch.setattr(attention_bwd, "backward", lambda *a, **kw: pytest.fail("called"))
    go, q, k, v, out, lse = _cpu_inputs()
    with config.patch(attention_backward="vendor"):
        dq, dk, dv = attention_grad.attention_backward(go, None, q, k, v, out, lse, False, 0.125)
    assert dk.shape == k.shape and not fallback.counters


@pytest.fixture
def measured(monkeypatch):
    """The "measure" mode on CPU tensors the support checks are told to accept, with runtime.choice's decide
    replaced by a recorder that answers ``measured.answer``; the backward's per-key memory emptied."""
    from torch_autows.runtime import choice
    from torch_autows.runtime.launch import BoundCache

    class Rec:
        answer, calls = False, []

    def decide(key, ours, theirs, prior, device):
        Rec.calls.append((key, prior, theirs))
        return choice.Decision(Rec.answer, "measured")

    Rec.calls = []
    monkeypatch.setattr(attention_bwd, "support_reason", lambda *a: None)
    monkeypatch.setattr(choice, "decide", decide)
    monkeypatch.setattr(attention_bwd, "_CHOSEN", BoundCache(256))
    monkeypatch.setattr(attention_bwd, "_PLANS", BoundCache(256))
    with config.patch(attention_backward="measure"):
        yield Rec


def test_measure_keeps_the_vendor_where_it_was_faster_and_decides_once(measured):
    """The default mode: the first call of a key asks runtime.choice (key: the op, dtype, head dim, mask, which
    gradients flow, heads, q/k/v in [B, S, H, D] rows or not, and B / Sq / Skv bucketed to powers of two; the prior
    ``backward_prior``; the vendor side ``vendor_backward`` on the call's tensors); where it keeps the vendor's, that
    call and the next ones of the key run the vendor's backward, with no fallback logged and nothing generated
    launched."""
    go, q, k, v, out, lse = _cpu_inputs()
    want = attention_grad.vendor_backward(go, None, q, k, v, out, lse, False, 0.125)
    for _ in range(3):
        got = attention_grad.attention_backward(go, None, q, k, v, out, lse, False, 0.125)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert len(measured.calls) == 1 and not fallback.counters
    key, prior, theirs = measured.calls[0]
    assert key == ("attention_backward", "torch.float32", 64, False, True, False, 4, 2, (False,) * 3, 1, 16, 8)
    assert prior is attention_bwd.backward_prior(64, False, 7) is False
    assert all(torch.equal(a, b) for a, b in zip(theirs(), want))
    assert attention_bwd.backward_prior(128, True, 4096) and not attention_bwd.backward_prior(128, True, 2048)


def test_measure_runs_ours_where_it_was_faster(measured, monkeypatch):
    """Where the choice keeps ours, the generated backward runs (its kernels replaced here by a recorder past the
    decision); a forced config or form is never measured."""
    measured.answer = True
    ran = []
    monkeypatch.setattr(attention_bwd, "choose_dq_mode", lambda *a: ran.append(a) or pytest.skip("past the choice"))
    go, q, k, v, out, lse = _cpu_inputs()
    with pytest.raises(pytest.skip.Exception):
        attention_grad.attention_backward(go, None, q, k, v, out, lse, False, 0.125)
    assert len(measured.calls) == 1 and len(ran) == 1
    ran.clear()
    with pytest.raises(pytest.skip.Exception):  # config named: no choice
        attention_bwd.backward(go, None, q, k, v, out, lse, False, 0.125, config="bwd_64x128_dp2",
                               vendor=attention_grad.vendor_backward)
    assert len(measured.calls) == 1 and len(ran) == 1


def test_measure_under_deterministic_algorithms_takes_ours(measured):
    """Deterministic algorithms on: ours without measuring (its separate form is bit-reproducible)."""
    go, q, k, v, out, lse = _cpu_inputs()
    torch.use_deterministic_algorithms(True)
    try:
        assert attention_bwd._decide(go, None, q, k, v, out, lse, False, 0.125, attention_grad.vendor_backward).use_ours
    finally:
        torch.use_deterministic_algorithms(False)
    assert not measured.calls


@pytest.mark.parametrize("mode", ["autows", "measure"])
def test_autows_on_cpu_falls_back_with_the_reason_logged_once(caplog, mode):
    """Either mode that tries the generated backward: on CPU tensors the vendor's runs, the reason logged once."""
    go, q, k, v, out, lse = _cpu_inputs()
    want = attention_grad.vendor_backward(go, None, q, k, v, out, lse, False, 0.125)
    with config.patch(attention_backward=mode), caplog.at_level(logging.WARNING, logger="torch_autows"):
        for _ in range(3):
            got = attention_grad.attention_backward(go, None, q, k, v, out, lse, False, 0.125)
            assert all(torch.equal(a, b) for a, b in zip(got, want))  # the vendor path, unchanged
    assert fallback.counters["attention_backward.fallback"] == 3
    lines = [r.getMessage() for r in caplog.records if "attention_backward" in r.getMessage()]
    assert len(lines) == 1 and "tensors on cpu" in lines[0]


def test_autows_serves_what_the_runtime_serves(monkeypatch):
    go, q, k, v, out, lse = _cpu_inputs()
    sentinel = (q + 1, k + 1, v + 1)
    seen = []
    monkeypatch.setattr(attention_bwd, "backward", lambda *a, **kw: seen.append((a, kw)) or sentinel)
    with config.patch(attention_backward="autows"):
        got = attention_grad.attention_backward(go, None, q, k, v, out, lse, True, 0.125)
    assert got is sentinel and seen[0][0][0] is go and seen[0][0][-2:] == (True, 0.125)
    assert seen[0][1] == {"vendor": None}  # "autows": no measured choice
    assert fallback.counters["attention_backward.autows"] == 1


def test_traced_calls_become_the_backward_op(sm90, monkeypatch):
    """A traced call (torch.compile's backward graph: fake tensors) the checks accept becomes
    ``autows::attention_backward`` (its fake impl: q's, k's and v's shapes), not a kernel launch."""
    monkeypatch.setattr(attention_bwd, "backward", lambda *a, **kw: pytest.fail("called with fake tensors"))
    q, k, v, out, lse, go = _call(hkv=2, sq=64, skv=70)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        q, k, v, out, lse, go = (mode.from_tensor(t) for t in (q, k, v, out, lse, go))
        graph = torch.fx.experimental.proxy_tensor.make_fx(
            lambda *t: attention_grad.generated_backward(t[0], None, *t[1:], False, 0.125))
        with config.patch(attention_backward="autows"):
            gm = graph(go, q, k, v, out, lse)
    ops = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert torch.ops.autows.attention_backward.default in ops, ops
    dq, dk, dv = (n for n in gm.graph.nodes if n.op == "output").__next__().args[0]
    assert [tuple(x.meta["val"].shape) for x in (dq, dk, dv)] == [(2, 8, 64, 64), (2, 2, 70, 64), (2, 2, 70, 64)]


def test_traced_calls_it_refuses_stay_with_the_vendor(sm90, caplog):
    q, k, v, out, lse, go = _call(d=96, hkv=8, sq=64, skv=64)
    with config.patch(attention_backward="autows"), caplog.at_level(logging.WARNING, logger="torch_autows"):
        assert attention_grad.generated_backward(go, None, q, k, v, out, lse, False, 0.125) is None
    assert fallback.counters["attention_backward.fallback"] == 1
    lines = [r.getMessage() for r in caplog.records if "attention_backward" in r.getMessage()]
    assert len(lines) == 1 and "head_dim 96" in lines[0]


def test_backward_op_on_cpu_is_the_vendors(caplog):
    """``autows::attention_backward`` on tensors the generated backward cannot serve (CPU) gives torch's gradients,
    contiguous, with the reason logged; opcheck (schema, fake impl, autograd registration) passes."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 9, 16, generator=g).transpose(1, 2).contiguous().transpose(1, 2)
    k, v = (torch.randn(1, 2, 7, 16, generator=g) for _ in range(2))
    out, lse = attention_grad.reference_attention(q, k, v, True, 0.25)
    go = torch.randn(1, 4, 9, 16, generator=g)
    with caplog.at_level(logging.INFO, logger="torch_autows"):
        got = torch.ops.autows.attention_backward(go, None, q, k, v, out, lse, True, 0.25)
    want = attention_grad.vendor_backward(go, None, q, k, v, out, lse, True, 0.25)
    for x, w in zip(got, want):
        assert x.is_contiguous()
        torch.testing.assert_close(x, w)
    assert fallback.counters["attention_backward.fallback"] == 1
    torch.library.opcheck(torch.ops.autows.attention_backward.default, (go, None, q, k, v, out, lse, True, 0.25))


# dq_mode None: the form chosen per call (these few keys: separate, its dQ kernel on 4 programs)
@pytest.mark.parametrize("dq_mode,grids,d,config", [("atomic", [2], 64, None), (None, [2, 4], 64, None),
                                                    ("separate", [2, 4], 64, None), ("reduce", [2], 128, None),
                                                    ("separate", [2, 4], 128, "bwd_64x128_dp2_fold"),
                                                    ("reduce", [2], 64, "bwd_128x128_dp2_dqsplit_fold")])
def test_backward_glue_runs_the_kernel_it_compiles(monkeypatch, dq_mode, grids, d, config):
    """``backward`` end to end on CPU with the launch replaced by the interpreter running the compiled Program: the
    argument order, the 2-D views (q in [B, S, H, D]), the grid (B*Hkv x launched KV blocks; the separate form's dQ
    kernel: B*Hq x Q blocks), pre- and postprocess give attention_grad's math gradients (bf16, causal, GQA, a
    gradient into lse, ragged lengths; the reduce form: its padded workspace as a TMA tensor, at d=128 the split dQ
    with its [64, 64] dQ^T reduce and the folded rows; the folded step, ``bwd_64x128_dp2_fold``, with its two extra
    scalars; at d=64 with 128-query steps the split dQ by query rows, ``bwd_128x128_dp2_dqsplit_fold``). dK/dV (and
    the separate form's dQ) are NaN-poisoned before."""
    from torch_autows.interp import run_partitioned
    from torch_autows.runtime import launch

    real_compile = launch.compile_kernel
    launched = []

    class Interpreted(launch.Launcher):
        def __call__(self, grid, args, device_index):
            launched.append((self.program.template, grid))
            values = {n: a.tensor if isinstance(a, launch.Tma) else a for n, a in zip(self.names, args)}
            run_partitioned(self.program, values, nprog=grid)

    class Kernel:
        def __init__(self, *key):
            self.program = real_compile(*key).program
            self.launcher = Interpreted(None, [], 0, tuple(a.name for a in self.program.args))
            self.launcher.program = self.program

    monkeypatch.setattr(attention_bwd, "support_reason", lambda *a: None)
    monkeypatch.setattr(attention_bwd, "compile_kernel", Kernel)
    monkeypatch.setattr(attention_bwd, "POISON", float("nan"))
    monkeypatch.setattr(device, "index", lambda d: 0)
    monkeypatch.setattr(device, "num_sms", lambda i: 132)  # the persistent dQ kernel's grid: min(tiles, SMs)
    g = torch.Generator().manual_seed(5)
    q = torch.randn(1, 70, 4, d, generator=g).to(torch.bfloat16).transpose(1, 2)
    k, v = (torch.randn(1, 2, 50, d, generator=g).to(torch.bfloat16) for _ in range(2))
    out, lse = attention_grad.reference_attention(q, k, v, True, 0.125)
    go, dlse = torch.randn(1, 4, 70, d, generator=g).to(torch.bfloat16), torch.randn(1, 4, 70, generator=g)
    got = attention_bwd.backward(go, dlse, q, k, v, out, lse, True, 0.125, dq_mode=dq_mode, config=config)
    ref = attention_grad.vendor_backward(go.float(), dlse, q.float(), k.float(), v.float(), out.float(), lse, True,
                                         0.125)
    # B*Hkv = 2, one KV block of 128 keys; the dQ kernel: B*Hq = 4, one block of 128 queries
    assert [g for _, g in launched] == grids
    assert [t for t, _ in launched] == ["attention_bwd", "attention_bwd_dq"][:len(grids)]
    for x, r, like in zip(got, ref, (q, k, v)):
        assert x.shape == like.shape and x.dtype == torch.bfloat16
        assert ((x.float() - r).norm() / r.norm()).item() < 2e-2


def test_backward_refuses_a_config_of_the_other_form(monkeypatch):
    monkeypatch.setattr(attention_bwd, "support_reason", lambda *a: None)
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 9, 128, generator=g) for _ in range(3))
    monkeypatch.setitem(attention_bwd.CONFIG_HEAD_DIMS, "bwd_32x128_dp2_dqsplit", {})  # as before the split dQ
    monkeypatch.setitem(attention_bwd.CONFIG_HEAD_DIMS, "bwd_64x128_dp2_dqsplit_fold", {})
    monkeypatch.setitem(attention_bwd.CONFIG_HEAD_DIMS, "bwd_64x128_dp2_dqsplit_fold_sr", {})
    with pytest.raises(Unsupported, match="no config serves head dim 128 in the reduce form.*'separate' does"):
        attention_bwd.backward(q, None, q, k, v, q, q[..., 0], False, 0.1, dq_mode="reduce")
    go, q, k, v, out, lse = _cpu_inputs()
    with pytest.raises(ValueError, match="'bwd_32x128_dp2' serves head dims \\(\\) in the atomic form"):
        attention_bwd.backward(go, None, q, k, v, out, lse, False, 0.125, config="bwd_32x128_dp2", dq_mode="atomic")
    with pytest.raises(ValueError, match="dq_config='dq_128x128_dp2' is for the separate form"):
        attention_bwd.backward(go, None, q, k, v, out, lse, False, 0.125, dq_mode="atomic", dq_config="dq_128x128_dp2")
    with pytest.raises(ValueError, match="dq_config 'dq_x' does not serve head dim 64"):
        attention_bwd.backward(go, None, q, k, v, out, lse, False, 0.125, dq_mode="separate", dq_config="dq_x")


def test_is_real_sees_through_functional_wrappers():
    """AOTAutograd traces a backward with functional tensors wrapping fake ones: not real (no data pointer), so the
    generated backward is put in the graph as its op instead of launched (on the H200 the launch path was taken and
    failed with "Cannot access data pointer of Tensor")."""
    from torch._subclasses.functional_tensor import FunctionalTensor, FunctionalTensorMode

    with FakeTensorMode() as mode:
        fake = mode.from_tensor(torch.empty(4))
        with FunctionalTensorMode():
            wrapped = FunctionalTensor.to_functional(fake)
        assert not device.is_real(fake) and not device.is_real(wrapped)
    assert device.is_real(torch.empty(4)) and not device.is_real(torch.empty(4, device="meta"))


def test_every_served_config_gets_exactly_its_arguments():
    """For every main-kernel config and form it serves (and every dQ config), the values the runtime builds name
    exactly the Program's arguments: the launcher refuses a missing or an extra name (a per-config scalar such as the
    folded step's ``qk_fold`` must reach only the programs that take it)."""
    from torch_autows.templates import attention_bwd as tmpl
    from torch_autows.templates import attention_bwd_dq as tmpl_dq

    g = torch.Generator().manual_seed(2)
    forms = {"atomic": "atomic", "reduce": "reduce", "separate": "none"}
    for d in (64, 128):
        q = torch.randn(1, 2, 70, d, generator=g).to(torch.bfloat16)
        k, v = (torch.randn(1, 1, 50, d, generator=g).to(torch.bfloat16) for _ in range(2))
        delta, lse2 = torch.zeros(140), torch.zeros(140)
        for name, opts in attention_bwd.CONFIGS.items():
            for mode, form in forms.items():
                if not attention_bwd.serves(name, d, mode):
                    continue
                program = tmpl.build(tmpl.AttentionBwdRequest(d, "bf16", True, dq=form), opts)
                values = tmpl.kernel_values(q, k, v, q, delta, lse2, True, 0.1, opts.block_n, dq=form,
                                            block_m=opts.block_m, fold=opts.fold_rows)
                assert set(values) == {a.name for a in program.args}, (name, mode, d)
        views = tmpl.kernel_values(q, k, v, q, delta, lse2, True, 0.1, 128, dq="none")
        for name, opts in attention_bwd.DQ_CONFIGS.items():
            program = tmpl_dq.build(tmpl_dq.AttentionBwdDqRequest(d, "bf16", True), opts)
            values = tmpl_dq.kernel_values(q, k, v, q, delta, lse2, True, 0.1, views=views)
            assert set(values) == {a.name for a in program.args}, (name, d)


def test_plan_launches_with_the_call_tensors():
    """``backward``'s fast path (``_Plan``, built after a CUDA call that read its tensors in place): a repeated call
    allocates dK/dV (zero past the launched KV blocks), the dQ workspace (zero) or dQ, and passes the kernels' bound
    launches this call's addresses by argument name; a bound launch that cannot serve (False) hands the call back
    (None). Here on CPU tensors, with recording stand-ins for the bound launches (the row kernels' torch versions)."""
    from torch_autows.templates.attention_bwd import kernel_values
    from torch_autows.templates.attention_bwd import preprocess as pre

    torch.manual_seed(0)
    q, go, out = (torch.randn(1, 2, 70, 64, dtype=torch.bfloat16) for _ in range(3))
    k, v = (torch.randn(1, 2, 200, 64, dtype=torch.bfloat16) for _ in range(2))
    lse = torch.randn(1, 2, 70)
    delta, lse2 = pre(out, go, lse)
    values = kernel_values(q, k, v, go, delta, lse2, True, 0.1, 128, dq="reduce", block_m=64)
    assert values["NB"] == 1  # causal, 70 queries: one KV block of 128 launched, keys 128..199 get zeros
    names = ("q", "k", "v", "do", "lse2", "delta", "dq_acc", "dk", "dv")
    seen = []
    main = (lambda *a: seen.append(a) or True, names)
    dq, dk, dv = attention_bwd._Plan(q, k, "reduce", values, 128, 0.1, main, None).run(go, None, q, k, v, out, lse)
    (got,) = seen
    assert got[:4] == (q.data_ptr(), k.data_ptr(), v.data_ptr(), go.data_ptr())
    assert got[7:] == (dk.data_ptr(), dv.data_ptr()) and dk.shape == dv.shape == k.shape
    assert not dk[:, :, 128:].any() and not dv[:, :, 128:].any()
    assert dq.shape == q.shape and not dq.any()  # the stand-in added nothing into the zeroed workspace
    assert attention_bwd._Plan(q, k, "reduce", values, 128, 0.1, (lambda *a: False, names), None).run(
        go, None, q, k, v, out, lse) is None
    # the separate form: the dQ kernel's launch gets the new dQ
    sep = kernel_values(q, k, v, go, delta, lse2, True, 0.1, 128, dq="none")
    dq_seen = []
    plan = attention_bwd._Plan(q, k, "separate", sep, 128, 0.1, (lambda *a: True, names[:6] + names[7:]),
                               (lambda *a: dq_seen.append(a) or True, ("q", "k", "v", "do", "lse2", "delta", "dq")))
    dq, _, _ = plan.run(go, None, q, k, v, out, lse)
    assert dq_seen[0][-1] == dq.data_ptr() and dq.shape == q.shape
    # a kernel argument a plan cannot address: no plan
    attention_bwd._PLANS.clear()
    attention_bwd._remember_plan("k", q, k, "reduce", values, 128, 0.1, (None, names + ("other",)))
    attention_bwd._remember_plan("k2", q, k, "reduce", values, 128, 0.1, (None, names))
    assert list(attention_bwd._PLANS) == ["k2"]
    attention_bwd._PLANS.clear()


def test_measure_asks_again_after_a_prior_answer(measured, monkeypatch):
    """A prior answer (runtime.choice answers by its cost rule while a CUDA graph is captured) is not remembered: the
    next call of the key asks again, and a measured answer then sticks."""
    from torch_autows.runtime import choice

    answers = iter([choice.Decision(False, "prior"), choice.Decision(False, "measured")])
    monkeypatch.setattr(choice, "decide", lambda *a: measured.calls.append(a) or next(answers))
    go, q, k, v, out, lse = _cpu_inputs()
    for _ in range(3):
        attention_grad.attention_backward(go, None, q, k, v, out, lse, False, 0.125)
    assert len(measured.calls) == 2

