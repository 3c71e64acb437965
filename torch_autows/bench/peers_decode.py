"""Decode peers: GEMMs of a few rows against Llama-3 weights, and a SwiGLU MLP through the backend.

GEMM cases (``DecodeCase``), in nn.Linear's layout as a model's decode runs them: ``x @ w.t()`` with the weight
``w`` [N, K] row-major. cuBLAS (``torch.mm``, peer ``default``), what a user of ``torch_autows.ops.gemm``
gets (``autows``: the measured choice of runtime.choice, our kernel or cuBLAS), and autows's generated kernel
forced (``autows-kernel``: ``config.choice = "autows"``; our own variant, not a peer in the ratio). Rows also
report the effective bandwidth: bytes of A, B and C over the time; the run's meta holds the copy ceiling (a
device-to-device copy measured in the same run).

MLP cases (``MlpCase``): ``x -> down(silu(gate(x)) * up(x))``, 4096 -> 14336 -> 4096, bf16, no bias, at a few
rows, through ``torch.compile`` default (``default``) and ``backend="autows"`` (``autows``).
"""
from __future__ import annotations

import contextlib

from .cases import DecodeCase
from .peers_gemm import make_inputs as _gemm_inputs
from .peers_gemm import reference as _gemm_reference
from .runner import Bound, Peer, Ref, Skip, Suite

DEVICE = "cuda"


def make_inputs(case) -> dict:
    import torch

    if isinstance(case, DecodeCase):
        inp = _gemm_inputs(case)
        inp["b"] = inp["b"].t().contiguous().t()  # the same values, as the transposed view of a [N, K] weight
        return inp
    torch.manual_seed(0)
    mlp = _mlp(case).to(DEVICE, torch.bfloat16)
    x = torch.randn(case.rows, case.hidden, device=DEVICE, dtype=torch.bfloat16)
    return {"mlp": mlp, "x": x}


def _mlp(case):
    import torch
    import torch.nn.functional as F

    class MLP(torch.nn.Module):
        def __init__(self, h, f):
            super().__init__()
            self.gate = torch.nn.Linear(h, f, bias=False)
            self.up = torch.nn.Linear(h, f, bias=False)
            self.down = torch.nn.Linear(f, h, bias=False)

        def forward(self, x):
            return self.down(F.silu(self.gate(x)) * self.up(x))

    m = MLP(case.hidden, case.ffn)
    for p in m.parameters():
        torch.nn.init.normal_(p, std=case.hidden ** -0.5)
    return m


def reference(case, inp) -> Ref | None:
    import torch

    if isinstance(case, DecodeCase):
        return _gemm_reference(case, inp)
    mlp, x = inp["mlp"], inp["x"]
    with torch.no_grad():
        g, u = x.float() @ mlp.gate.weight.float().t(), x.float() @ mlp.up.weight.float().t()
        return Ref((torch.nn.functional.silu(g) * u) @ mlp.down.weight.float().t())


def _bind_cublas(case, inp) -> Bound:
    import torch

    a, b = inp["a"], inp["b"]
    out = torch.empty(case.M, case.N, device=a.device, dtype=a.dtype)
    return Bound(lambda: torch.mm(a, b, out=out), out=out)


def _choice(mode: str):
    """A context that sets ``torch_autows.config.choice`` (how a site picks ours or the vendor's)."""
    @contextlib.contextmanager
    def ctx():
        from torch_autows import config

        prior = getattr(config, "choice", "measure")
        config.choice = mode
        try:
            yield
        finally:
            config.choice = prior
    return ctx


def _bind_autows(case, inp) -> Bound:
    from torch_autows import ops

    if not isinstance(case, DecodeCase):
        raise Skip("a GEMM peer")
    a, b = inp["a"], inp["b"]
    return Bound(lambda: ops.gemm(a, b), counters=("gemm",), context=_choice("autows"))


def _bind_chosen(case, inp) -> Bound:
    from torch_autows import ops
    from torch_autows.runtime import choice

    a, b = inp["a"], inp["b"]

    def note():
        d = next((d for k, d in reversed(choice.records.items()) if k[0] == "mm" and k[-2:] == (case.N, case.K)), None)
        return d and d.describe()

    return Bound(lambda: ops.gemm(a, b), context=_choice("measure"), inspect=note)


def _compiled(case, inp, backend: str | None) -> Bound:
    import torch

    mlp, x = inp["mlp"], inp["x"]
    mode = "reduce-overhead" if case.graphs else None
    if backend == "autows":
        from .model import autows_backend

        cm = torch.compile(mlp, backend=autows_backend(), dynamic=False, mode=mode)
    else:
        cm = torch.compile(mlp, dynamic=False, mode=mode)

    def fn():
        with torch.no_grad():
            return cm(x)

    return Bound(fn, context=_choice("measure"))


def _bind_default(case, inp) -> Bound:
    return _bind_cublas(case, inp) if isinstance(case, DecodeCase) else _compiled(case, inp, None)


def _bind_ours(case, inp) -> Bound:
    return _bind_chosen(case, inp) if isinstance(case, DecodeCase) else _compiled(case, inp, "autows")


def all_peers() -> tuple[list[Peer], list[str]]:
    peers = [Peer("default", _bind_default, "GEMM: torch.mm (cuBLAS, out=, poisoned); MLP: torch.compile(mlp)"),
             Peer("autows-kernel", _bind_autows, "GEMM: torch_autows.ops.gemm forced to our kernel (not a peer)"),
             Peer("autows", _bind_ours, "GEMM: torch_autows.ops.gemm, measured choice (ours or cuBLAS); "
                                        'MLP: torch.compile(mlp, backend="autows")')]
    return peers, []


def copy_ceiling_tbps() -> float:
    """Device-to-device copy bandwidth (read + write bytes over time) of a 2 GiB buffer, median of do_bench."""
    import torch
    from triton.testing import do_bench

    src = torch.empty(1 << 30, dtype=torch.uint8, device=DEVICE)
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), warmup=25, rep=200, return_mode="median")
    return 2 * src.numel() / (ms * 1e-3) / 1e12


def run_meta() -> dict:
    return {"copy_ceiling_tbps": round(copy_ceiling_tbps(), 3)}


def suite(cases: list, peers: list[Peer]) -> Suite:
    return Suite("decode", cases, peers, make_inputs, reference)
