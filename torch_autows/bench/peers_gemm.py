"""GEMM peers: cuBLAS, Inductor max-autotune, Triton 3.6 auto-WS, the hand-written Gluon reference, autows."""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from .results import REPO_ROOT
from .runner import Bound, Peer, Ref, Skip, Suite

REFERENCE_FILE = "gluon_ws_gemm.py"
REF_TILE = (128, 256, 64)  # BM, BN, BK of the reference's defaults; it needs dims that are multiples
DEVICE = "cuda"  # tests run the CPU-capable peers with "cpu"


def _dtype(name: str):
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16}[name]


def make_inputs(case) -> dict:
    import torch

    dt = _dtype(case.dtype)
    lead = (case.batch,) if case.op == "bmm" else ()
    a = torch.randn(*lead, case.M, case.K, device=DEVICE, dtype=dt)
    b = torch.randn(*lead, case.K, case.N, device=DEVICE, dtype=dt)
    bias = torch.randn(case.N, device=DEVICE, dtype=dt) if case.op == "addmm" else None
    return {"a": a, "b": b, "bias": bias}


def reference(case, inp) -> Ref | None:
    """fp32 (no TF32) on the GPU; None (cuBLAS's output is then the reference) if it needs > half of free memory."""
    import torch

    a, b, bias = inp["a"], inp["b"], inp["bias"]
    need = 4 * (a.numel() + b.numel() + a.numel() // case.K * case.N)
    if a.is_cuda and need > torch.cuda.mem_get_info()[0] // 2:
        return None
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        out = torch.matmul(a.float(), b.float())
        if bias is not None:
            out += bias.float()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev
    return Ref(out)


def _out(case, inp):
    import torch

    a = inp["a"]
    return torch.empty(*a.shape[:-1], case.N, device=a.device, dtype=a.dtype)


def _bind_cublas(case, inp) -> Bound:
    import torch

    a, b, bias = inp["a"], inp["b"], inp["bias"]
    out = _out(case, inp)
    if case.op == "bmm":
        return Bound(lambda: torch.bmm(a, b, out=out), out=out)
    if case.op == "addmm":
        return Bound(lambda: torch.addmm(bias, a, b, out=out), out=out)
    return Bound(lambda: torch.mm(a, b, out=out), out=out)


def _mm(a, b):
    import torch

    return torch.mm(a, b)


def _bmm(a, b):
    import torch

    return torch.bmm(a, b)


def _addmm(bias, a, b):
    import torch

    return torch.addmm(bias, a, b)


def _bind_inductor(case, inp) -> Bound:
    import torch

    a, b, bias = inp["a"], inp["b"], inp["bias"]
    f = {"mm": _mm, "bmm": _bmm, "addmm": _addmm}[case.op]
    compiled = torch.compile(f, mode="max-autotune-no-cudagraphs", dynamic=False)
    if case.op == "addmm":
        return Bound(lambda: compiled(bias, a, b))
    return Bound(lambda: compiled(a, b))


def _bind_triton(case, inp) -> Bound:
    from . import peers_triton

    a, b, bias = inp["a"], inp["b"], inp["bias"]
    out = _out(case, inp)
    state = {}

    def fn():
        c, state["kernel"] = peers_triton.matmul(a, b, bias, out=out)
        return c

    return Bound(fn, out=out, inspect=lambda: peers_triton.ws_note(state.get("kernel")))


def find_reference() -> Path | None:
    """The Gluon reference file: $TORCH_AUTOWS_REFERENCE (file or folder), ../shared/reference, ./shared/reference."""
    cands = []
    env = os.environ.get("TORCH_AUTOWS_REFERENCE")
    if env:
        p = Path(env)
        cands.append(p if p.suffix == ".py" else p / REFERENCE_FILE)
    for base in (REPO_ROOT.parent, REPO_ROOT, Path.cwd(), Path.cwd().parent):
        cands.append(base / "shared" / "reference" / REFERENCE_FILE)
    return next((p.resolve() for p in cands if p.is_file()), None)


_REF_MODULE = {}


def load_reference(path: Path):
    if path not in _REF_MODULE:
        spec = importlib.util.spec_from_file_location("torch_autows_bench_gluon_ws_gemm", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        _REF_MODULE[path] = mod
    return _REF_MODULE[path]


def _bind_reference(path: Path):
    def bind(case, inp) -> Bound:
        bm, bn, bk = REF_TILE
        if case.op != "mm" or case.M % bm or case.N % bn or case.K % bk:
            raise Skip(f"the reference does plain mm with dims multiple of {REF_TILE}")
        mod = load_reference(path)
        a, b = inp["a"], inp["b"]
        return Bound(lambda: mod.matmul(a, b))

    return bind


def _bind_autows(case, inp, mode: str = "autows") -> Bound:
    from torch_autows import ops

    from .peers_decode import _choice

    a, b, bias = inp["a"], inp["b"], inp["bias"]
    counted = mode == "autows"
    if case.op == "bmm":
        return Bound(lambda: ops.bmm(a, b), counters=("bmm",) if counted else (), context=_choice(mode))
    return Bound(lambda: ops.gemm(a, b, bias), counters=("gemm",) if counted else (), context=_choice(mode))


def _bind_chosen(case, inp) -> Bound:
    return _bind_autows(case, inp, "measure")


def all_peers() -> tuple[list[Peer], list[str]]:
    """(peers in table order, notes about peers left out)."""
    peers = [Peer("cublas", _bind_cublas, "torch.mm / torch.bmm / torch.addmm (out=, poisoned)"),
             Peer("inductor-max-autotune", _bind_inductor, 'torch.compile(mode="max-autotune-no-cudagraphs")'),
             Peer("triton-autows", _bind_triton,
                  "Triton 3.6 tl.range(warp_specialize=True), 128x256x64, 3 stages, 4 warps")]
    notes = []
    ref = find_reference()
    if ref is None:
        notes.append(f"gluon-reference skipped: {REFERENCE_FILE} not found (set TORCH_AUTOWS_REFERENCE)")
    else:
        peers.append(Peer("gluon-reference", _bind_reference(ref), f"hand-written Gluon WS GEMM ({ref})"))
    peers.append(Peer("autows", _bind_autows, "torch_autows.ops.gemm / bmm forced to the generated kernel (fails if "
                      "it fell back to torch)"))
    peers.append(Peer("autows-chosen", _bind_chosen, "torch_autows.ops.gemm / bmm with the measured choice (ours or "
                      "cuBLAS): what a user gets; not a peer in the ratio"))
    return peers, notes


def suite(cases: list, peers: list[Peer]) -> Suite:
    return Suite("gemm", cases, peers, make_inputs, reference)
