"""Training-step peers on the Llama-style decoder (llama.py): one forward, backward and AdamW step.

Each call is ``zero_grad(set_to_none=True)``, ``loss = model(x)``, ``out.backward(dy)`` with a fixed random
``dy``, ``opt.step()``. AdamW runs with ``lr=0``: every kernel of the step runs as in training, but the
weights do not move, so every call (warm, checked, timed) computes the same gradients and the peers share
one model. The checked output is the gradient of the first block's weights and the final norm (flattened):
it went through every layer's backward. Reference: the same weights in fp32 (SDPA through ``gqa="repeat"``,
so torch's fp32 fused kernel serves it), TF32 off. Tolerance as the model work: 1e-2 or twice eager bf16's
own error. GPU time is split into GEMM / attention / rest as in ``model.py``.
"""
from __future__ import annotations

import dataclasses

from .model import autows_backend, profile_split, site_notes, tolerance
from .runner import Bound, Peer, Ref, Suite


def make_inputs(case) -> dict:
    import torch

    from .llama import LlamaConfig, build_model

    cfg = LlamaConfig(n_layers=case.layers)
    model = build_model(cfg, device="cuda", dtype=torch.bfloat16, seed=0).train()
    gen = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(case.batch, case.seqlen, cfg.hidden, device="cuda", dtype=torch.bfloat16, generator=gen)
    dy = torch.randn(x.shape, device="cuda", dtype=torch.bfloat16, generator=gen)
    return {"model": model, "x": x, "dy": dy, "cfg": cfg}


def _probes(model) -> list:
    """The parameters whose gradients a call returns: the first block's (the end of the backward) and the final norm."""
    return list(model.layers[0].parameters()) + [model.norm.weight]


def reference(case, inp) -> Ref:
    import torch

    from .llama import LlamaDecoder

    cfg = dataclasses.replace(inp["cfg"], gqa="repeat")
    with torch.device("cuda"):
        ref_model = LlamaDecoder(cfg)
    ref_model.load_state_dict(inp["model"].state_dict())
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        ref_model(inp["x"].float()).backward(inp["dy"].float())
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev
    out = torch.cat([p.grad.flatten() for p in _probes(ref_model)])
    del ref_model
    return Ref(out)


def _step(model, step_model, x, dy):
    """One training step of ``step_model`` (``model`` or its compiled form) with a fresh AdamW (lr 0)."""
    import torch

    opt = torch.optim.AdamW(model.parameters(), lr=0.0)
    probes = _probes(model)

    def step():
        opt.zero_grad(set_to_none=True)
        step_model(x).backward(dy)
        opt.step()
        return torch.cat([p.grad.flatten() for p in probes])

    return step


def _bound(step) -> Bound:
    import contextlib

    return Bound(step, extra=lambda: profile_split(step, contextlib.nullcontext))


def _bind_eager(case, inp) -> Bound:
    return _bound(_step(inp["model"], inp["model"], inp["x"], inp["dy"]))


def _compiled(**kw):
    def bind(case, inp) -> Bound:
        import torch

        cm = torch.compile(inp["model"], dynamic=False, **kw)
        return _bound(_step(inp["model"], cm, inp["x"], inp["dy"]))

    return bind


def _bind_autows(case, inp, backend=None) -> Bound:
    import torch

    cm = torch.compile(inp["model"], backend=backend or autows_backend(), dynamic=False)
    b = _bound(_step(inp["model"], cm, inp["x"], inp["dy"]))
    b.counters = ("gemm", "bmm", "attention")
    b.inspect = site_notes()
    return b


def _bind_autows_bwd(case, inp) -> Bound:
    """As ``autows``, with the generated attention backward (``config.attention_backward = "autows"``): its
    backward graph calls ``autows::attention_backward`` where the checks pass, also at a site whose forward the
    choice gives to the vendor (inductor.support.attention_choice)."""
    from torch_autows import config

    autows = autows_backend()
    # its own backend object: Dynamo reuses a graph compiled for the same backend, and this one must be traced
    # again with the option on
    b = _bind_autows(case, inp, backend=lambda gm, example_inputs: autows(gm, example_inputs))
    b.context = lambda: config.patch(attention_backward="autows")
    b.counters = ("attention_backward",)
    return b


def all_peers() -> tuple[list[Peer], list[str]]:
    peers = [Peer("eager", _bind_eager, "plain eager PyTorch, fwd + bwd + AdamW (foreach)"),
             Peer("inductor", _compiled(), "torch.compile(model) (Inductor default mode), then AdamW"),
             Peer("inductor-max-autotune", _compiled(mode="max-autotune-no-cudagraphs"),
                  'torch.compile(model, mode="max-autotune-no-cudagraphs"), then AdamW'),
             Peer("autows", _bind_autows, 'torch.compile(model, backend="autows"), then AdamW (the attention '
                  'backward by config.attention_backward\'s default, "measure": ours where measured faster); fails '
                  "unless an autows kernel ran"),
             Peer("autows-gen-bwd", _bind_autows_bwd, 'as autows, with config.attention_backward = "autows" (the '
                  "generated attention backward); fails unless it ran")]
    return peers, []


def suite(cases: list, peers: list[Peer]) -> Suite:
    return Suite("train", cases, peers, make_inputs, reference, tolerance=tolerance)
