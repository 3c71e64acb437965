"""Can autows serve this site? The checks shared by the FX rewrites, the GEMM choice and ``explain()``.

Every check returns ``None`` (autows can serve it) or a reason a user can act on. Sites autows does not
take are left to Inductor's default path and the reason is logged once per distinct reason
(``note_site``), so a model with 48 identical layers logs one line, not 48.

The checks see fake tensors (Dynamo's ``example_value``, AOT's ``val``) or Inductor IR nodes, never
real data. Symbolic sizes are replaced by their hints: a generated kernel is specialised per shape at
run time, and a shape it cannot serve there still falls back inside the op, so deciding on the hint
is safe. ``_pretend_target`` (tests only) makes CPU-traced graphs count as sm_90 targets; the ops then
still check the real device at run time and fall back.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable

import torch

from .. import config
from ..diagnostics import sites

log = logging.getLogger("torch_autows")

#: Test-only, never set by the package: CPU-traced graphs count as sm_90 targets and the runtime's support
#: checks are asked without their device check, so the FX rewrites fire on a machine without the GPU (the
#: ops still check the real device at run time and fall back). Set by test/inductor/conftest.py's
#: ``pretend`` fixture and test/distributed/_worker.py; part of the Inductor cache key (graph_passes).
_pretend_target: bool = False

#: Compile-time site counts: "<op>.rewritten", "<op>.left" (left to Inductor), "gemm.choice" (offered to autotune).
#: They and the log-once are ``torch_autows.diagnostics.sites``: ``site_counters`` and ``_logged`` are its
#: ``counters`` and ``logged`` (the same objects, under the names callers use).
site_counters = sites.counters
_logged = sites.logged

_FLOATS = (torch.float16, torch.bfloat16, torch.float32)


def note_site(op: str, reason: str) -> None:
    """A site of ``op`` stays on Inductor's default path; log ``reason`` the first time it is seen."""
    sites.count(f"{op}.left")
    sites.log_once((op, reason), "autows %s: left to Inductor's default path: %s", op, reason)


def reset() -> None:
    """Forget site counts and which reasons were logged (tests, examples)."""
    sites.reset()


@functools.cache
def _capability(index: int | None) -> tuple[int, int] | None:
    try:
        return torch.cuda.get_device_capability(index if index is not None else torch.cuda.current_device())
    except Exception:  # no CUDA in this process (fake CUDA tensors while tracing on a CPU machine)
        return None


def device_reason(device: torch.device) -> str | None:
    """None when ``device`` is a CUDA sm_90 GPU (or, in tests, ``_pretend_target`` is set)."""
    device = torch.device(device)
    if device.type == "cuda" and torch.version.hip is None:
        cap = _capability(device.index)
        if cap == (9, 0) or _pretend_target:
            return None
        if cap is None:
            return "CUDA is not available in this process; autows kernels need a CUDA sm_90 GPU"
        return (f"{device} is sm_{cap[0]}{cap[1]}; autows generates kernels for sm_90 (Hopper) only")
    if _pretend_target:
        return None
    return f"tensors on {device.type}; autows kernels need a CUDA sm_90 GPU (Hopper)"


def same_size(a, b) -> bool:
    """``a == b`` for sizes that may be symbolic, without adding a guard (unknown: False)."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    return a is b or statically_known_true(a == b)


def max_autotune_on() -> bool:
    """Whether the active Inductor config autotunes GEMMs: then our GEMM is an autotuning choice (choices.py),
    else the post-grad rewrite serves GEMMs (rewrite_gemm.py)."""
    from torch._inductor import config as ic

    return bool(ic.max_autotune or ic.max_autotune_gemm)


# --- fake tensors the runtime's support checks can read ---

def _hint(s, fallback: int = 4096) -> int:
    if isinstance(s, int):
        return s
    node = getattr(s, "node", None)
    h = getattr(node, "hint", None) if node is not None else None
    return int(h) if h is not None else fallback


_fake_mode = None


def fake_tensor(size, stride, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A fake tensor of these sizes, strides, dtype and device (no memory; what the support checks read)."""
    global _fake_mode
    from torch._subclasses.fake_tensor import FakeTensorMode

    if _fake_mode is None:
        _fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    with _fake_mode:
        return torch.empty_strided(tuple(size), tuple(stride), dtype=dtype, device=device)


def concrete(t: torch.Tensor | None) -> torch.Tensor | None:
    """``t`` with symbolic sizes replaced by hints, and on a (fake) CUDA device when pretending sm_90."""
    if t is None:
        return None
    symbolic = any(not isinstance(s, int) for s in (*t.shape, *t.stride()))
    pretend = t.device.type != "cuda" and _pretend_target
    if not symbolic and not pretend:
        return t
    device = torch.device("cuda", 0) if pretend else t.device
    return fake_tensor([_hint(s) for s in t.shape], [_hint(s, 1) for s in t.stride()], t.dtype, device)


_MISSING = {"gemm": "torch_autows.runtime.gemm is not available in this build",
            "swiglu": "torch_autows.runtime.swiglu is not available in this build",
            "swiglu_bwd": "torch_autows.runtime.swiglu_bwd is not available in this build",
            "gemm_rope": "torch_autows.runtime.gemm_rope is not available in this build",
            "attention": "no generated attention kernel in this build (torch_autows.runtime.attention is missing)"}


def _runtime_reason(name: str, *args, check: str = "support_reason") -> str | None:
    """``torch_autows.runtime.<name>.<check>(*args)`` (``support_reason``, or the module's own check such as
    ``gemm_rope.rope_reason``), the check the op makes again at run time; asked
    without its device check when pretending sm_90 (it would see this CPU or non-sm_90 machine). The runtime
    is looked up as the ops look it up (``ops.runtime_module``: None where it cannot be imported)."""
    from .. import ops

    rt = ops.runtime_module(name)
    if rt is None:
        return _MISSING[name]
    try:
        r = getattr(rt, check)(*args, check_device=not _pretend_target)
    except Exception as e:  # a support check must never break compilation
        return f"runtime support check raised {type(e).__name__}: {e}"
    return None if r is None else str(r)


def _gemm_gate(device: torch.device) -> str | None:
    """Why no generated GEMM-template kernel (GEMM, SwiGLU) serves here at all: switched off, or the device."""
    if not config.gemm:
        return "disabled by torch_autows.config.gemm = False (TORCH_AUTOWS_GEMM=0)"
    return device_reason(device)


def gemm_reason(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None,
                out_dtype: torch.dtype | None = None, residual: torch.Tensor | None = None,
                activation: str = "none") -> str | None:
    """Why autows cannot serve ``act(a @ b (+ bias)) (+ residual [M, N])`` (2-D) or ``bmm(a, b)`` (3-D); None when
    it can."""
    r = _gemm_gate(a.device)
    if r:
        return r
    for name, t in (("a", a), ("b", b), ("bias", bias)):
        if t is not None and t.dtype not in _FLOATS:
            return f"{name} has dtype {t.dtype}; autows GEMM serves float16, bfloat16 and float32"
    if bias is not None and (bias.dim() != 1 or bias.dtype != a.dtype):
        return f"bias of shape {tuple(bias.shape)} / {bias.dtype}: only a 1-D [N] bias of the inputs' dtype is fused"
    if residual is None and activation == "none":
        return _runtime_reason("gemm", concrete(a), concrete(b), concrete(bias), out_dtype)
    if a.dtype == torch.float32:
        what = "residual" if residual is not None else "activation"
        return f"float32 operands: the {what} epilogue is the generated kernel's, which takes 16-bit operands"
    if residual is None:
        return _runtime_reason("gemm", concrete(a), concrete(b), concrete(bias), out_dtype)
    return _runtime_reason("gemm", concrete(a), concrete(b), concrete(bias), out_dtype, concrete(residual))


def swiglu_reason(a: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor) -> str | None:
    """Why autows cannot serve ``silu(a @ w_gate) * (a @ w_up)`` in one kernel; None when it can."""
    r = _gemm_gate(a.device)
    if r:
        return r
    if a.dtype not in (torch.float16, torch.bfloat16):
        return f"dtype {a.dtype}; the fused SwiGLU GEMM takes float16 or bfloat16"
    return _runtime_reason("swiglu", concrete(a), concrete(w_gate), concrete(w_up))


def rope_reason(a: torch.Tensor, b: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                bias: torch.Tensor | None = None) -> str | None:
    """Why autows cannot serve ``rope(a @ b (+ bias))`` in one kernel (tables cos, sin [P, D] as the op takes them);
    None when it can."""
    r = _gemm_gate(a.device)
    if r:
        return r
    if a.dtype not in (torch.float16, torch.bfloat16):
        return f"dtype {a.dtype}; the RoPE GEMM takes float16 or bfloat16"
    return _runtime_reason("gemm_rope", *(concrete(t) for t in (a, b, cos, sin, bias)), check="rope_reason")


def attention_reason(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool,
                     scale: float | None) -> str | None:
    """Why autows cannot serve this attention; None when it can (shape validity is checked by rewrite_attention.py)."""
    if not config.attention:
        return "disabled by torch_autows.config.attention = False (TORCH_AUTOWS_ATTENTION=0)"
    r = device_reason(q.device)
    if r:
        return r
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    for name, t in (("q", q), ("k", k), ("v", v)):
        if t is not None and is_traceable_wrapper_subclass(t):  # DTensor: the op has no sharding strategy
            return (f"{name} is a {type(t).__name__}; autows::attention takes plain tensors (with tensor "
                    "parallelism, keep the projections' outputs local: ColwiseParallel(use_local_output=True))")
    return _runtime_reason("attention", concrete(q), concrete(k), concrete(v), is_causal, scale)


# --- the measured choice at compile time (runtime.choice) ---

def _static(*ts) -> bool:
    return all(t is None or all(isinstance(s, int) for s in (*t.shape, *t.stride())) for t in ts)


@dataclasses.dataclass(frozen=True)
class SiteChoice:
    """A servable site's side: ``use_ours`` and how it was decided (``why``); ``why`` None: undecided at compile
    time (symbolic sizes, or no GPU to measure on), so the runtime decides at the first call of each bucket."""

    use_ours: bool
    why: str | None = None

    @property
    def vendor_reason(self) -> str | None:
        """The reason to leave the site to Inductor's default path, or None."""
        return None if self.use_ours else f"the vendor's kernel is chosen: {self.why}"


def _site_choice(decide: Callable, prior: Callable[[], bool], *ts) -> SiteChoice:
    """Decided now where the sizes are static: measured on this GPU (or read from the decisions cache) in
    ``config.choice = "measure"``, the cost rule in "prior", forced in "autows" / "vendor"."""
    from ..runtime import choice

    mode = choice.mode()
    if mode in ("autows", "vendor"):
        return SiteChoice(mode == "autows", f"forced by config.choice = {mode!r}")
    if mode == "prior":
        return SiteChoice(prior(), "the cost rule (config.choice = 'prior'), not measured")
    real = all(t is None or (t.device.type == "cuda" and _capability(t.device.index) == (9, 0)) for t in ts)
    if not (real and _static(*ts)):
        return SiteChoice(True)
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    try:
        with unset_fake_temporarily():  # the measurement runs on real tensors, whatever mode the pass runs in
            d = decide()
    except Exception as e:  # a failed measurement must not break compilation: the runtime decides later
        log.warning("autows: could not measure the choice at compile time (%s: %s); deciding at run time",
                    type(e).__name__, e)
        return SiteChoice(True)
    return SiteChoice(d.use_ours, d.describe())


def gemm_choice(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None,
                residual: torch.Tensor | None = None, activation: str = "none") -> SiteChoice:
    """The side of a servable GEMM site (2-D, or 3-D bmm); the vendor is cuBLAS through aten. A site with a
    residual is fused only where measured faster than cuBLAS's GEMM plus one read of R (the default adds the
    residual in its next pointwise kernel, which then reads one more tensor than after the fusion;
    runtime.gemm._decide): with symbolic sizes, or in prior mode, it stays with Inductor. A site with an
    activation likewise, measured against cuBLAS then torch's gelu (the default's GEMM and pointwise kernel)."""
    from ..runtime import choice
    from ..runtime import gemm as rt

    if a.dtype == torch.float32:  # runs torch inside the op anyway (the kernel takes 16-bit operands)
        return SiteChoice(residual is None)
    fused = "a residual" if residual is not None else f"an activation ({activation})" if activation != "none" else None
    if fused and choice.mode() != "autows" and not _static(a, b, bias, residual):
        return SiteChoice(False, f"{fused} fusion is kept only where measured faster, which needs static sizes")
    m = _hint(a.shape[0]) * (_hint(a.shape[1]) if a.dim() == 3 else 1)
    n, k = _hint(b.shape[-1]), _hint(a.shape[-1])
    prior = (lambda: False) if fused else (lambda: choice.gemm_prior(m, n, k))
    return _site_choice(lambda: rt.site_decision(a, b, bias, residual=residual, activation=activation), prior,
                        a, b, bias, residual)


def swiglu_choice(a: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, save: bool = False) -> SiteChoice:
    """The side of a servable SwiGLU site: the fused kernel, or Inductor's two cuBLAS GEMMs and product (``save``: a
    training site, whose kernel also writes the projections; kept on Inductor's path until that kernel has passed
    its GPU tests, runtime.swiglu.SAVE_GPU_CHECKED)."""
    from ..runtime import choice
    from ..runtime import swiglu as rt

    if save and not rt.SAVE_GPU_CHECKED:
        return SiteChoice(False, rt.SAVE_NOT_CHECKED)
    m, n, k = _hint(a.shape[0]), _hint(w_gate.shape[-1]), _hint(a.shape[-1])
    return _site_choice(lambda: rt.site_decision(a, w_gate, w_up, save=save), lambda: choice.gemm_prior(m, n, k),
                        a, w_gate, w_up)


def rope_choice(a: torch.Tensor, b: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                bias: torch.Tensor | None = None) -> SiteChoice:
    """The side of a servable RoPE site: the fused kernel where measured faster than cuBLAS then one pointwise RoPE
    kernel (runtime.gemm_rope.site_decision); with symbolic sizes, or in prior mode, Inductor's path (no runtime
    choice stands behind the op: the site is decided here)."""
    from ..runtime import choice
    from ..runtime import gemm_rope as rt

    if choice.mode() != "autows":
        if not _static(a, b, cos, sin, bias):
            return SiteChoice(False, "a RoPE fusion is kept only where measured faster, which needs static sizes")
        if _hint(a.shape[0]) <= 128:
            # the measurement times the GPU only; runtime.gemm_rope has no replay fast path yet, so its host time per
            # call (the full launch path) would show at decode, where a forward waits on its launches
            return SiteChoice(False, "decode rows (M <= 128): the fused RoPE launch has no replay fast path yet")
    side = _site_choice(lambda: rt.site_decision(a, b, cos, sin, bias), lambda: False, a, b, cos, sin, bias)
    if side.why is None:  # undecided here (the measurement failed): nothing decides later, so the default's path
        return SiteChoice(False, "not measured at compile time; a RoPE fusion is kept only where measured faster")
    return side


def rope_verdict(a: torch.Tensor, b: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 bias: torch.Tensor | None = None) -> tuple[str | None, str | None]:
    """``gemm_verdict`` for a RoPE site."""
    reason = rope_reason(a, b, cos, sin, bias)
    if reason is not None:
        return reason, None
    return None, rope_choice(a, b, cos, sin, bias).vendor_reason


def gemm_verdict(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None,
                 residual: torch.Tensor | None = None, activation: str = "none") -> tuple[str | None, str | None]:
    """What a rewrite records on a GEMM site: (why autows cannot serve it, why the vendor's kernel is chosen), each
    None where it does not apply; the choice is made only for a site that can be served."""
    reason = gemm_reason(a, b, bias, None, residual=residual, activation=activation)
    if reason is not None:
        return reason, None
    return None, gemm_choice(a, b, bias, residual=residual, activation=activation).vendor_reason


#: The runtimes' switches that change what a rewrite makes beside ``config``: kernels that wait for their GPU tests
#: (module, flag). Part of the compile cache key (graph_passes.autows_uuid), so a run that turns one the other way (a
#: test, a new kernel tried before its gate is flipped) never reads a graph compiled as it was.
KERNEL_GATES = (("swiglu", "SAVE_GPU_CHECKED"), ("swiglu_bwd", "GPU_CHECKED"))


def kernel_gates() -> tuple:
    """The values of ``KERNEL_GATES`` (None where a runtime cannot be imported)."""
    from .. import ops

    return tuple(getattr(ops.runtime_module(name), flag, None) for name, flag in KERNEL_GATES)


def swiglu_bwd_reason(dy: torch.Tensor, w: torch.Tensor, g: torch.Tensor, u: torch.Tensor) -> str | None:
    """Why autows cannot serve the SwiGLU backward's ``dy @ w`` with the product's gradients in one kernel."""
    r = _gemm_gate(dy.device)
    if r:
        return r
    if dy.dtype not in (torch.float16, torch.bfloat16):
        return f"dtype {dy.dtype}; the fused SwiGLU backward GEMM takes float16 or bfloat16"
    return _runtime_reason("swiglu_bwd", concrete(dy), concrete(w), concrete(g), concrete(u))


def swiglu_bwd_verdict(dy: torch.Tensor, w: torch.Tensor, g: torch.Tensor,
                       u: torch.Tensor) -> tuple[str | None, str | None]:
    """``gemm_verdict`` for a SwiGLU backward site: the fused kernel, or Inductor's cuBLAS GEMM and pointwise
    gradients (runtime.swiglu_bwd.site_decision)."""
    from ..runtime import choice
    from ..runtime import swiglu_bwd as rt

    reason = swiglu_bwd_reason(dy, w, g, u)
    if reason is not None:
        return reason, None
    if not rt.GPU_CHECKED:
        return None, rt.NOT_CHECKED
    m, n, k = _hint(dy.shape[0]), _hint(w.shape[-1]), _hint(dy.shape[-1])
    return None, _site_choice(lambda: rt.site_decision(dy, w, g, u), lambda: choice.gemm_prior(m, n, k),
                              dy, w, g, u).vendor_reason


def swiglu_verdict(a: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor,
                   save: bool = False) -> tuple[str | None, str | None]:
    """``gemm_verdict`` for a SwiGLU site (``save``: the op that also writes the projections)."""
    reason = swiglu_reason(a, w_gate, w_up)
    if reason is not None:
        return reason, None
    return None, swiglu_choice(a, w_gate, w_up, save).vendor_reason


def attention_choice(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool,
                     scale: float | None) -> SiteChoice:
    """The side of a servable attention site; the vendor is SDPA's fused pick (ops.torch_attention)."""
    from .. import ops
    from ..runtime import attention as rt
    from ..runtime import choice

    if q.dtype == torch.float32:
        return SiteChoice(True)
    d, skv = _hint(q.shape[-1]), _hint(k.shape[-2])
    side = _site_choice(lambda: rt.site_decision(q, k, v, is_causal, scale, ops.torch_attention),
                        lambda: choice.attention_prior(d, is_causal, skv), q, k, v)
    if not side.use_ours and config.attention_backward == "autows" and any(t.requires_grad for t in (q, k, v)):
        # the op must be in the graph for its autograd (the generated backward) to run; its forward still runs the
        # vendor's kernel, as the runtime choice says (ops.run_attention), and saves that kernel's out and lse
        return SiteChoice(True, f"the generated backward is asked for (config.attention_backward = 'autows'); "
                                f"the forward runs the vendor's kernel ({side.why})")
    return side
