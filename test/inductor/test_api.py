"""enable() / disable() / inductor_options() / TORCH_AUTOWS=1 / explain()."""
from __future__ import annotations

import torch
import torch._inductor.config as ic
import torch.nn.functional as F
from torch._inductor.custom_graph_pass import CustomGraphPass

import torch_autows
from torch_autows.inductor import api, choices, graph_passes, support

KEYS = ("pre_grad_custom_pass", "post_grad_custom_post_pass")


class UserPass(CustomGraphPass):
    def __init__(self):
        self.calls = 0

    def __call__(self, graph):
        self.calls += 1

    def uuid(self):
        return "user-pass-v1"


def _state():
    return {k: (api._unset(ic, k), getattr(ic, k)) for k in KEYS}, ic.get_config_copy()


def test_enable_disable_round_trip_restores_config_exactly():
    _round_trip()


def test_round_trip_from_a_fresh_process_keeps_the_keys_unset():
    """In a fresh process the keys start unset (an earlier compile in this one may have left them "set to
    None", which the round trip above must restore as it found it); disable() leaves them unset again."""
    import subprocess
    import sys

    code = ("import sys; sys.path.insert(0, 'test/inductor'); import test_api as t; "
            "b, _ = t._state(); assert all(u for u, _ in b.values()), b; t._round_trip(); print('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-2000:]


def _round_trip():
    before, copy = _state()
    torch_autows.enable()
    torch_autows.enable()  # idempotent: no double wrapping
    assert isinstance(ic.post_grad_custom_post_pass, graph_passes.AutoWSPostGradPass)
    assert isinstance(ic.pre_grad_custom_pass, graph_passes.AutoWSPreGradPass)
    assert ic.post_grad_custom_post_pass.user is None and graph_passes.installed()
    torch_autows.disable()
    torch_autows.disable()  # idempotent
    assert _state() == (before, copy)
    assert not graph_passes.installed()


def test_enable_chains_and_restores_the_users_passes():
    pre, post = UserPass(), UserPass()
    with ic.patch(pre_grad_custom_pass=pre, post_grad_custom_post_pass=post):
        torch_autows.enable()
        assert ic.pre_grad_custom_pass.user is pre and ic.post_grad_custom_post_pass.user is post
        assert ic.post_grad_custom_post_pass.uuid() != graph_passes.AutoWSPostGradPass(None).uuid()
        torch_autows.disable()
        assert ic.pre_grad_custom_pass is pre and ic.post_grad_custom_post_pass is post
        assert not api._unset(ic, "post_grad_custom_post_pass")


def test_enable_routes_plain_torch_compile(pretend):
    user = UserPass()

    def f(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True) * 2

    q, k, v = (torch.randn(1, 2, 8, 16) for _ in range(3))
    with ic.patch(pre_grad_custom_pass=user):
        torch_autows.enable()
        try:
            out = torch.compile(f)(q, k, v)
            assert isinstance(choices._current(), choices.AutoWSChoices)  # installed by the post-grad pass
        finally:
            torch_autows.disable()
    assert not isinstance(choices._current(), choices.AutoWSChoices)
    torch.testing.assert_close(out, f(q, k, v), atol=1e-5, rtol=1e-5)
    assert support.site_counters["attention.rewritten"] == 1
    assert user.calls == 1  # the user's pre-grad pass still ran


def test_inductor_options():
    opts = torch_autows.inductor_options()
    assert set(opts) == set(KEYS)
    assert isinstance(opts["post_grad_custom_post_pass"], graph_passes.AutoWSPostGradPass)
    opts = torch_autows.inductor_options("max-autotune")
    assert opts["max_autotune"] is True and isinstance(opts["pre_grad_custom_pass"], graph_passes.AutoWSPreGradPass)
    assert all(getattr(ic, k) is None for k in KEYS)  # asking for options changes nothing


def test_env_var_enables(monkeypatch):
    monkeypatch.setenv("TORCH_AUTOWS", "0")
    api.enable_from_env()
    assert not api.enabled()
    monkeypatch.setenv("TORCH_AUTOWS", "1")
    api.enable_from_env()
    try:
        assert api.enabled() and graph_passes.installed()
    finally:
        torch_autows.disable()
    assert not api.enabled()


class Attn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(32, 96)
        self.o = torch.nn.Linear(32, 32)

    def forward(self, x):
        B, S, _ = x.shape
        q, k, v = self.qkv(x).view(B, S, 3, 4, 8).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        b = torch.softmax(q @ k.transpose(-2, -1) * 0.25 + torch.zeros(S, S), dim=-1) @ v  # masked: not served
        return self.o((a + b).transpose(1, 2).reshape(B, S, 32))


def test_explain_reports_each_site(pretend, capsys):
    report = torch_autows.explain(Attn(), torch.randn(2, 16, 32))
    text = capsys.readouterr().out
    assert str(report) in text
    assert report.count("attention") == 2 and report.count("attention", "autows") == 1
    assert report.count("gemm") == 4 and report.count("gemm", "autows") == 4  # 2 linear + the masked site's 2
    lines = text.splitlines()
    assert lines[0].startswith("autows explain: 1 graph(s); attention 1/2 sites served, GEMM 4/4 sites served")
    sdpa = next(ln for ln in lines if " sdpa " in ln)
    assert "causal=True" in sdpa and "-> autows" in sdpa and "test_api.py" in sdpa
    assert any("explicit" in ln and "-> fallback" in ln and "mask" in ln for ln in lines)
    assert all("post-grad rewrite" in ln for ln in lines if ln.strip().startswith("gemm"))
    mat = torch_autows.explain(Attn(), torch.randn(2, 16, 32), mode="max-autotune", print_report=False)
    assert all("autotuning" in s.why for s in mat.sites if s.kind == "gemm")


def test_explain_on_cpu_says_why(capsys):
    report = torch_autows.explain(Attn(), torch.randn(2, 16, 32), print_report=False)
    assert capsys.readouterr().out == ""
    assert report.count("attention", "autows") == 0 and report.count("gemm", "autows") == 0
    assert all("tensors on cpu" in s.why for s in report.sites if "mask" not in s.why)


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(64, 192)
        self.o = torch.nn.Linear(64, 64)

    def forward(self, x):
        B, S, _ = x.shape
        q, k, v = self.qkv(x).view(B, S, 3, 4, 16).permute(2, 0, 3, 1, 4)
        return self.o(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, S, 64))


def test_explain_reports_the_choice(pretend, monkeypatch):
    """Servable sites say how ours-or-vendor is decided: the prior's answer, or per shape bucket at run time."""
    monkeypatch.setattr(torch_autows.config, "choice", "prior", raising=False)
    model, x = Block().bfloat16(), torch.randn(2, 16, 64, dtype=torch.bfloat16)
    report = torch_autows.explain(model, x, print_report=False)
    assert report.count("gemm", "vendor") == 2 and report.count("attention", "vendor") == 1  # small: vendor
    assert all("cost rule" in s.why for s in report.sites if s.kernel == "vendor")
    assert "3 servable site(s) kept on the vendor's faster kernel" in str(report)
    monkeypatch.setattr(torch_autows.config, "choice", "measure")  # nothing to measure on here: per call
    report = torch_autows.explain(model, x, print_report=False)
    assert report.count("gemm", "autows") == 2 and report.count("attention", "autows") == 1
    assert all("chosen at run time per shape bucket" in s.why for s in report.sites if s.kernel == "autows")
