"""The post-grad SwiGLU backward rewrite (inductor/rewrite_swiglu_bwd.py): in training graphs of the Llama MLP the
dh GEMM and the product's gradients become one ``autows::gemm_swiglu_bwd`` (Inductor's silu decomposition, nn.SiLU,
x * sigmoid(x); bf16 and fp16), with gradients as eager's; other activations stay unfused with a reason; inference
graphs and symbolic sizes are left alone. The op passes opcheck and its runtime's support check reads fake tensors."""
from __future__ import annotations

import pytest
import torch
import torch._inductor.config as ic
import torch.nn as nn
import torch.nn.functional as F
from programs import fake_cuda

from torch_autows.inductor import api, support
from torch_autows.runtime import swiglu_bwd as rt_swiglu_bwd

from .conftest import compile_time_yes
from .conftest import post_grad_graphs as _post_grad_graphs

ACTS = {"silu": F.silu, "module": nn.SiLU(), "sigmoid": lambda x: x * torch.sigmoid(x), "gelu": F.gelu,
        "relu": F.relu, "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x)}


class MLP(nn.Module):
    def __init__(self, h=32, f=48, act="silu"):
        super().__init__()
        self.gate, self.up = nn.Linear(h, f, bias=False), nn.Linear(h, f, bias=False)
        self.down = nn.Linear(f, h, bias=False)
        self.act = ACTS[act]

    def forward(self, x):
        return self.down(self.act(self.gate(x)) * self.up(x))


@pytest.fixture
def swiglu_bwd_pretend(pretend, monkeypatch):
    monkeypatch.setattr(rt_swiglu_bwd, "support_reason", compile_time_yes(rt_swiglu_bwd.support_reason))
    monkeypatch.setattr(rt_swiglu_bwd, "GPU_CHECKED", True)


def _grads(model, x, dy, compiled: bool, monkeypatch=None, dynamic=False):
    """(the backward graph's text, x.grad, the parameters' grads) of one step; x's and the model's grads reset."""
    x = x.detach().requires_grad_()
    model.zero_grad(set_to_none=True)
    seen = _post_grad_graphs(monkeypatch) if compiled else []
    if compiled:
        with ic.patch(api.inductor_options()):
            y = torch.compile(model, dynamic=dynamic)(x)
            y.backward(dy)
    else:
        model(x).backward(dy)
    return (seen[-1] if seen else ""), x.grad, [p.grad for p in model.parameters()]


@pytest.mark.parametrize("act", ["silu", "module", "sigmoid"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_training_mlp_backward_is_fused(swiglu_bwd_pretend, monkeypatch, act, dtype):
    torch.manual_seed(0)
    model = MLP(act=act).to(dtype)
    x, dy = torch.randn(2, 5, 32, dtype=dtype), torch.randn(2, 5, 32, dtype=dtype)
    graphs, gx, gw = _grads(model, x, dy, True, monkeypatch)
    assert support.site_counters["swiglu_bwd.rewritten"] == 1
    assert "autows.gemm_swiglu_bwd" in graphs and "aten.sigmoid" not in graphs  # the gradients' math is inside
    _, ex, ew = _grads(model, x, dy, False)  # eager, same dtype
    ref32 = MLP(act=act)
    ref32.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
    _, fx32, fw32 = _grads(ref32, x.float(), dy.float(), False)
    for got, eager, exact in zip([gx, *gw], [ex, *ew], [fx32, *fw32]):
        # no further from fp32 than eager's own 16-bit gradients (plus one rounding's worth)
        err, eager_err = ((got.float() - exact).norm() / exact.norm()).item(), \
            ((eager.float() - exact).norm() / exact.norm()).item()
        assert err <= 2 * eager_err + 4e-3, (err, eager_err)


@pytest.mark.parametrize("act", ["quick_gelu", "gelu", "relu"])
def test_other_activations_stay_unfused(swiglu_bwd_pretend, monkeypatch, log_warnings, act):
    model = MLP(act=act).to(torch.bfloat16)
    x, dy = torch.randn(4, 32, dtype=torch.bfloat16), torch.randn(4, 32, dtype=torch.bfloat16)
    graphs, gx, _ = _grads(model, x, dy, True, monkeypatch)
    assert "gemm_swiglu_bwd" not in graphs and support.site_counters["swiglu_bwd.rewritten"] == 0
    if act == "quick_gelu":  # x * sigmoid(1.702 x): the same shape of graph, another function; said so
        assert "is not the SwiGLU product's gradients" in log_warnings.text
    _, ex, _ = _grads(model, x, dy, False)
    torch.testing.assert_close(gx, ex, atol=2e-2, rtol=2e-2)


def test_inference_graph_and_symbolic_sizes_are_left_alone(swiglu_bwd_pretend, monkeypatch):
    model = MLP().to(torch.bfloat16)
    x = torch.randn(3, 32, dtype=torch.bfloat16)
    with torch.no_grad(), ic.patch(api.inductor_options()):
        torch.compile(model)(x)
    assert support.site_counters["swiglu_bwd.rewritten"] == 0
    torch._dynamo.reset()
    for n in (3, 7):  # dynamic rows: the site is not decided at compile time, so the default's path runs it
        graphs, gx, _ = _grads(model, torch.randn(n, 32, dtype=torch.bfloat16),
                               torch.randn(n, 32, dtype=torch.bfloat16), True, monkeypatch, dynamic=True)
        assert "gemm_swiglu_bwd" not in graphs and gx.shape == (n, 32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_op_passes_opcheck(dtype):
    dy, w = torch.randn(6, 8, dtype=dtype), torch.randn(8, 12, dtype=dtype)
    g, u = torch.randn(6, 12, dtype=dtype), torch.randn(6, 12, dtype=dtype)
    torch.library.opcheck(torch.ops.autows.gemm_swiglu_bwd.default, (dy, w, g, u))
    dg, du = torch.ops.autows.gemm_swiglu_bwd(dy, w, g, u)
    dh, s = dy.double() @ w.double(), torch.sigmoid(g.double())
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(du.double(), dh * g.double() * s, atol=tol, rtol=tol)
    torch.testing.assert_close(dg.double(), dh * u.double() * s * (1 + g.double() * (1 - s)), atol=tol, rtol=tol)
    with pytest.raises(ValueError, match="dy @ w must be"):
        torch.ops.autows.gemm_swiglu_bwd(dy, w, g[:, :4], u)


def test_runtime_support_reason_on_fake_tensors():
    dy, w, g, u = fake_cuda(256, 128), fake_cuda(128, 192), fake_cuda(256, 192), fake_cuda(256, 192)
    why = rt_swiglu_bwd.support_reason
    assert why(dy, w, g, u, check_device=False) is None
    assert "saved projection g" in why(dy, w, fake_cuda(256, 192, dtype=torch.float16), u, check_device=False)
    assert "saved projection u" in why(dy, w, g, fake_cuda(256, 192, stride=(1, 256)), check_device=False)
    assert "dims" in why(fake_cuda(2, 256, 128), w, g, u, check_device=False)


def test_prior_keeps_the_vendors_path(monkeypatch):
    """Under TORCH_AUTOWS_CHOICE=prior the backward keeps the vendor's path even at the Llama training shape where
    the plain GEMM's prior takes ours: the fused kernel measured slower there (its prior is not gemm_prior)."""
    from torch_autows import config
    from torch_autows.runtime import choice

    m, n, k = 16384, 14336, 4096
    dy, w, g, u = fake_cuda(m, k), fake_cuda(k, n), fake_cuda(m, n), fake_cuda(m, n)
    assert choice.gemm_prior(m, n, k)
    with config.patch(choice="prior"):
        d = rt_swiglu_bwd._decide(dy, w, g, u, m, n, k, (False, False))
    assert d == choice.Decision(False, "prior")


def test_the_measurement_races_every_config(monkeypatch):
    """The measured choice times every config of runtime.swiglu_bwd against the vendor's path (the decision keeps the
    fastest), under a key that names the configs, so a decision measured before a config joined is measured again."""
    from torch_autows.runtime import choice

    seen = {}

    def fake_decide(key, runs, vendor, prior, device):
        seen.update(key=key, runs=runs, prior=prior)
        return choice.Decision(True, "measured", 1.0, 2.0, 0.0, config="swiglu_bwd_p_128x256")

    monkeypatch.setattr(choice, "decide", fake_decide)
    m, n, k = 16384, 14336, 4096
    dy, w, g, u = fake_cuda(m, k), fake_cuda(k, n), fake_cuda(m, n), fake_cuda(m, n)
    d = rt_swiglu_bwd._decide(dy, w, g, u, m, n, k, (False, False))
    assert d.config == "swiglu_bwd_p_128x256" and seen["prior"] is False
    assert set(seen["runs"]) == set(rt_swiglu_bwd.CONFIGS) and len(rt_swiglu_bwd.CONFIGS) > 1
    assert seen["key"][-1] == tuple(rt_swiglu_bwd.CONFIGS)


def test_unchecked_kernel_leaves_the_site_to_inductor(swiglu_bwd_pretend, monkeypatch, log_warnings):
    """Until the GPU tests have passed the kernel (runtime.swiglu_bwd.GPU_CHECKED), a matched site keeps the
    default's path, with that reason logged."""
    monkeypatch.setattr(rt_swiglu_bwd, "GPU_CHECKED", False)
    model = MLP().to(torch.bfloat16)
    x, dy = torch.randn(4, 32, dtype=torch.bfloat16), torch.randn(4, 32, dtype=torch.bfloat16)
    graphs, _, _ = _grads(model, x, dy, True, monkeypatch)
    assert "gemm_swiglu_bwd" not in graphs and support.site_counters["swiglu_bwd.rewritten"] == 0
    assert "has not passed its GPU numerics tests" in log_warnings.text


def _gradients(form: str):
    """The SwiGLU gradients after dh = dy @ w as a function (traced by make_fx: aten ops with fake values), in
    ``form``: "silu" and "exp" (two ways to write the sigmoid) are the gradients; the rest almost are."""
    def f(dy, w, g, u):
        dh = torch.mm(dy, w)
        gf = g.float()
        s = 1 / (1 + torch.exp(-gf)) if form == "exp" else torch.sigmoid(gf)
        du = dh * (gf * s).to(dh.dtype)
        dsilu = s if form == "no_term" else s * (1 + gf * (1 - s))  # "no_term": sigmoid's factor alone
        if form == "off_by_1pct":  # within bf16's rounding of the right answer, but another function
            dsilu = dsilu * 1.01
        dg = ((dh * u).float() * dsilu).to(dh.dtype)
        if form == "swapped":  # du from U's silu: another function of the same tensors
            du = dh * (u.float() * torch.sigmoid(u.float())).to(dh.dtype)
        outs = (dg, du)
        if form == "dh_returned":
            outs += (dh,)
        if form == "third_result":
            outs += (dh * 2,)
        if form == "third_tensor":  # dG scaled by a third tensor
            dg = dg * dy[:, :1].sum()
            outs = (dg, du)
        return outs

    return f


@pytest.mark.parametrize("form,reason", [
    ("silu", None), ("exp", None),
    ("no_term", "not the SwiGLU product's gradients"), ("swapped", "not the SwiGLU product's gradients"),
    ("off_by_1pct", "not the SwiGLU product's gradients"),
    ("dh_returned", "dh is also used outside"), ("third_tensor", "read 3 tensors beside dh"),
    ("third_result", "not a candidate"),
])
def test_recognised_by_value(swiglu_bwd_pretend, form, reason):
    from torch.fx.experimental.proxy_tensor import make_fx

    from torch_autows.inductor.rewrite_swiglu_bwd import find_swiglu_bwd_sites

    args = (torch.randn(16, 8, dtype=torch.bfloat16), torch.randn(8, 24, dtype=torch.bfloat16),
            torch.randn(16, 24, dtype=torch.bfloat16), torch.randn(16, 24, dtype=torch.bfloat16))
    gm = make_fx(_gradients(form), tracing_mode="fake")(*args)
    sites = find_swiglu_bwd_sites(gm.graph)
    if reason == "not a candidate":  # three results: not reported as a near miss (a softmax gradient has several)
        assert sites == []
        return
    (site,) = sites
    if reason is None:
        assert site.reason is None and site.vendor is None
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        assert (site.g, site.u) == (placeholders[2], placeholders[3])  # told apart by value, not by position
        ref = _gradients("silu")(*args)
        outs = {n: i for i, n in enumerate(next(n for n in gm.graph.nodes if n.op == "output").args[0])}
        assert [outs[site.dg], outs[site.du]] == [0, 1]
        torch.testing.assert_close(ref[0], _gradients(form)(*args)[0])
    else:
        assert reason in site.reason


@pytest.fixture
def both_checked(swiglu_bwd_pretend, monkeypatch):
    """Both SwiGLU training fusions may be chosen (their kernels as if GPU-checked; swiglu's support check pretends)."""
    from torch_autows.runtime import swiglu as rt_swiglu

    monkeypatch.setattr(rt_swiglu, "support_reason", compile_time_yes(rt_swiglu.support_reason))
    monkeypatch.setattr(rt_swiglu, "SAVE_GPU_CHECKED", True)


def _training_step_matches_eager(model, step, monkeypatch):
    """``step(module) -> loss`` compiled and eager: both SwiGLU fusions in every layer, gradients as eager's."""
    seen = _post_grad_graphs(monkeypatch)
    with ic.patch(api.inductor_options()):
        step(torch.compile(model)).backward()
    got = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    step(model).backward()
    for g, p in zip(got, model.parameters()):
        e = p.grad.float()
        assert ((g.float() - e).norm() / e.norm().clamp_min(1e-9)).item() < 3e-2
    return "\n".join(seen)


def test_llama_example_training_step(both_checked, monkeypatch):
    from torch_autows.bench.llama import LlamaConfig, build_model

    cfg = LlamaConfig(n_layers=2, hidden=256, n_heads=4, n_kv_heads=2, head_dim=64, ffn=512, max_seq_len=64)
    model = build_model(cfg, device="cpu", dtype=torch.bfloat16).train()
    x = torch.randn(2, 32, 256, dtype=torch.bfloat16)
    graphs = _training_step_matches_eager(model, lambda m: m(x).float().square().mean(), monkeypatch)
    assert support.site_counters["swiglu.rewritten"] == 2 and support.site_counters["swiglu_bwd.rewritten"] == 2
    assert graphs.count("autows.gemm_swiglu_save") == 2 and graphs.count("autows.gemm_swiglu_bwd") == 2


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_hf_llama_training_step(both_checked, monkeypatch, attn):
    transformers = pytest.importorskip("transformers")  # not a test dependency: runs where it is installed
    cfg = transformers.LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=688, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                   use_cache=False, attn_implementation=attn)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).train()
    ids = torch.randint(0, 512, (2, 32))
    _training_step_matches_eager(model, lambda m: m(input_ids=ids, labels=ids).loss, monkeypatch)
    assert support.site_counters["swiglu.rewritten"] == 2 and support.site_counters["swiglu_bwd.rewritten"] == 2


def test_ops_fall_back_to_torch_with_the_reason_logged(log_warnings):
    """On a CPU both training ops run torch's path with the kernel's numbers, counted and logged once with why."""
    from torch_autows.runtime import fallback

    a, w = torch.randn(6, 8, dtype=torch.bfloat16), torch.randn(8, 12, dtype=torch.bfloat16)
    g, u = torch.randn(6, 12, dtype=torch.bfloat16), torch.randn(6, 12, dtype=torch.bfloat16)
    h, gs, us = torch.ops.autows.gemm_swiglu_save(a, w, w * 2)
    torch.testing.assert_close(gs.float(), a.float() @ w.float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(h.float(), F.silu(gs.float()) * us.float(), atol=5e-2, rtol=5e-2)
    torch.ops.autows.gemm_swiglu_bwd(a, w, g, u)
    for op in ("gemm_swiglu_save", "gemm_swiglu_bwd"):
        assert fallback.counters[f"{op}.fallback"] == 1
        assert f"autows {op}: falling back to torch: tensors on cpu" in log_warnings.text
