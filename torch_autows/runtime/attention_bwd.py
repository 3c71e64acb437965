"""Attention backward runtime: support check, config choice and launch of the generated kernels
(templates/attention_bwd.py, templates/attention_bwd_dq.py; passes/BACKWARD.md).

``backward(grad_out, grad_lse, q, k, v, out, lse, is_causal, scale, config=None, dq_mode=None, dq_config=None)
-> (dq, dk, dv)`` runs the preprocess (delta, lse2: ``attention_bwd_rows``, one Triton kernel, which also zeroes the
atomic and reduce forms' fp32 dQ workspace, as cuDNN's and FlashAttention-3's preprocess do) and then one of three
forms (``dq_mode``):

* "atomic": the main kernel computes dK, dV and adds each step's dQ into a zeroed fp32 workspace with fp32 atomics;
  the dQ conversion (``attention_bwd_rows``) gives dQ = scale * workspace. The adds reorder from run to run: not
  bit-reproducible.
* "reduce": as "atomic", but each step's dQ tile goes registers -> an fp32 SMEM staging tile -> one TMA bulk
  reduce-add (``cp.reduce.async.bulk.tensor ... .add.f32``, FlashAttention-3's dQ accumulation) into a workspace
  padded to whole Q blocks per head; no per-element atomics. Not bit-reproducible either (the adds reorder).
* "separate": the main kernel without dQ (4 GEMMs a step), then the dQ kernel (one CTA per Q block, looping over
  the KV blocks; it recomputes S and dP). Every gradient element is written once by one CTA: deterministic.

``dq_mode`` None picks by head dim, mask and keys (``choose_dq_mode``): "reduce" at d=64 from 1024 keys, at d=128 from
1024 where the keys are whole KV tiles (dK/dV then go out by TMA: the ``_sr`` picks) and from 2048 otherwise,
"separate" elsewhere, "separate" always under deterministic algorithms. Measured on the H200
(bench/results/2026-12-01-h200-attention-bwd-2.json and -4; sweeps/2026-12-01-h200-attention-bwd-configs-6.json, -7
and 2026-12-02 -9): separate ran 1.18-1.53x the atomic form everywhere; reduce ran separate's 0.91x (512 keys) to
1.09x (8192) at d=64, 0.97x (1024) to 1.13x (8192) at d=128; with dK/dV by TMA 1.04-1.11x separate's at 1024 keys,
d=128 (H100, sweeps/2026-12-05-h100-attention-bwd-store-in-ring.json). "atomic" must be asked for; with
deterministic algorithms on, asking for "atomic" or "reduce" raises ``Unsupported``.
``config`` names the main kernel's config (``CONFIGS``), ``dq_config`` the dQ kernel's
(``DQ_CONFIGS``, separate form only); None: ``choose_config`` / ``choose_dq_config``. It raises ``Unsupported``
with ``support_reason``'s reason where it cannot serve a call; ``attention_grad.attention_backward`` then runs the
vendor's backward. A repeated call with the same shapes, strides, dtypes, arguments and deterministic mode runs the
first call's plan (``_Plan``: no checks or choices again; the generated kernels launched with only the new tensors'
addresses, ``launch.BoundCache``): on the H200 154-226 us of CPU a call against 242-374 for the first path
(bench/results/sweeps/2026-12-02-h200-host-cost-2.json; cuDNN's backward 65-136). Configs and their choice live in
``attention_bwd_configs`` (re-exported here).
"""
from __future__ import annotations

import functools
from dataclasses import replace

import torch

from ..ir import Options, walk
from ..passes.memory_plan import hosted_stages, hosted_store
from ..templates import attention_bwd_dq as dq_host
from ..templates.attention_bwd import (
    HEAD_DIMS,
    AttentionBwdRequest,
    gradients,
    kernel_values,
    kv_buffers,
    kv_gradients,
    workspace_rows,
)
from ..templates.attention_bwd_dq import AttentionBwdDqRequest
from . import attention_bwd_rows as rows
from . import choice
from . import device as dev
from .attention_bwd_configs import (  # noqa: F401  (re-exported: runtime.attention_bwd is where callers look for them)
    CONFIG_HEAD_DIMS,
    CONFIGS,
    DQ_CONFIG_HEAD_DIMS,
    DQ_CONFIGS,
    DQ_MODES,
    NONDETERMINISTIC,
    REDUCE_FROM_KEYS,
    REDUCE_LONG,
    REDUCE_PICKS,
    SHORT,
    backward_prior,
    choose_config,
    choose_dq_config,
    dq_serves,
    reduce_by_default,
    serves,
)
from .fallback import Unsupported
from .gemm import DTYPES
from .launch import BoundCache, Tma, compile_kernel


def choose_dq_mode(dq_mode: str | None = None, d: int | None = None, keys: int | None = None,
                   causal: bool = False) -> str:
    """The form for a call at head dim ``d`` with ``keys`` keys a head, with the causal mask or not: ``dq_mode`` if
    given; else "reduce" where ``REDUCE_FROM_KEYS`` says so (keys None: as for many keys) and "separate" elsewhere
    (ahead of "atomic" everywhere), and "separate" always while deterministic algorithms are on (every gradient
    element written once).
    Raises ``Unsupported`` for "atomic" or "reduce" asked for while deterministic algorithms are on."""
    if dq_mode is not None and dq_mode not in DQ_MODES:
        raise ValueError(f"attention backward dq_mode={dq_mode!r}; use one of {DQ_MODES} or None (chosen per call)")
    deterministic = torch.are_deterministic_algorithms_enabled()
    if dq_mode in NONDETERMINISTIC and deterministic:
        how = "fp32 atomics" if dq_mode == "atomic" else "TMA reduce-adds"
        raise Unsupported(f"{dq_mode} dQ is not deterministic (its {how} reorder; torch.use_deterministic_algorithms "
                          f"is on); dq_mode='separate' is")
    if dq_mode is None:
        return "reduce" if reduce_by_default(d, causal, keys) and not deterministic else "separate"
    return dq_mode


def _same(*ts) -> bool:
    return all(t.dtype == ts[0].dtype for t in ts)


def support_reason(q, k, v, out, lse, grad_out, is_causal=False, scale=None, *,
                   check_device: bool = True) -> str | None:
    """Why ``backward`` cannot serve this call (None: it can). Works on fake tensors."""
    why = dev.sm90_reason(q.device, check_device)
    if why:
        return why
    if q.dtype not in (torch.bfloat16, torch.float16):
        return f"dtype {q.dtype}; the generated attention backward takes bfloat16 or float16"
    if not _same(q, k, v, out, *(() if grad_out is None else (grad_out,))):
        return "q, k, v, out and grad_out differ in dtype; the generated attention backward takes one dtype"
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return "q, k and v must be [B, H, S, D]"
    D = q.shape[-1]
    if D not in HEAD_DIMS or k.shape[-1] != D or v.shape[-1] != D:
        return (f"head_dim {D} (k {k.shape[-1]}, v {v.shape[-1]}) not served by the generated attention backward "
                f"({', '.join(map(str, HEAD_DIMS))} are, the same for q, k and v)")
    B, Hq, Sq, _ = q.shape
    if k.shape[:3] != v.shape[:3] or k.shape[0] != B or Hq % max(k.shape[1], 1):
        return "k and v must share [B, Hkv, Skv] with q's batch and Hq a multiple of Hkv"
    if Sq < 1 or k.shape[2] < 1 or q.numel() == 0 or k.numel() == 0:
        return "an empty sequence, batch or head count"
    if tuple(out.shape) != tuple(q.shape) or tuple(lse.shape) != (B, Hq, Sq):
        return "out must be q's shape and lse [B, Hq, Sq]"
    tensors = {"q": q, "k": k, "v": v, **({} if grad_out is None else {"grad_out": grad_out})}
    return dev.alignment_reason(**tensors)


#: Tests set this to a float (NaN) that fills dK/dV (and the separate form's dQ) before the launch, so a row the
#: kernel fails to write shows.
POISON: float | None = None

#: (a call's metadata, kernel) -> (launch.Bound, its tensor arguments' names) for calls whose q, k, v and dO are read
#: in place.
_BOUND = BoundCache(256)

_VIEWS = ("q", "k", "v", "do")


def _key(grad_out, grad_lse, q, k, v, out, lse, is_causal, scale, *kernel):
    return tuple((t.shape, t.stride(), t.dtype) if t is not None else None for t in (grad_out, grad_lse, q, k, v, out,
                                                                                      lse)) + (
        q.device, bool(is_causal), float(scale), *kernel)


def _launch(template: str, request, opts: Options, values: dict, grid: int, key, in_place: bool, device) -> None:
    """Run one kernel on ``values`` (a value per argument name; q, k, v and do as 2-D row views; every tensor argument
    of the kernel, the reduce form's dQ workspace too, goes through a TMA descriptor of its whole shape): through the
    bound launch cached under ``key`` where there is one, else compiled (cached by launch.compile_kernel) and launched,
    and bound for next time where ``in_place``."""
    hit = _BOUND.get(key)
    if hit is not None and hit[0](*(values[n].data_ptr() for n in hit[1])):
        return
    idx = dev.index(device)
    grid = dev.grid(grid, opts.persistent, idx, opts.ctas_per_sm)
    try:  # no directory to write the kernel source to (or another OSError): the vendor's backward serves the call
        kernel = compile_kernel(template, request, opts)
        launcher = kernel.launcher
    except OSError as e:
        raise Unsupported(f"could not build the kernel: {e}") from e
    names = tuple(a.name for a in kernel.program.args if a.kind != "scalar")
    descs = [a.name for a in kernel.program.args if a.kind == "tensor"]
    args = launcher.ordered({**values, **{n: Tma(values[n], tuple(values[n].shape), tuple(values[n].stride()))
                                          for n in descs}})
    try:
        launcher(grid, args, idx)
    except OSError as e:
        raise Unsupported(f"could not compile the kernel: {e}") from e
    if in_place:
        _BOUND.remember(key, launcher, grid, args, idx, names)


@functools.lru_cache(maxsize=256)
def _stages_in_slots(template: str, request, opts: Options) -> bool:
    """Whether ``request``'s program stages every TMA store in a slot its partition has finished reading
    (passes/buffers.stage_in_slots) or in the bytes of the ring it read last (``Options.store_in_ring``,
    passes/memory_plan.hosted_stages): the gradients then go out by TMA without SMEM of their own. Where a store
    would need SMEM of its own (the dq_split configs' dV without store_in_ring: K is read by both chains), the pointer
    form stays. A program that does not compile (SMEM, an unlowered order) keeps the pointer form too."""
    try:
        program = compile_kernel(template, request, opts).program
    except OSError:  # no directory for the kernel source: _launch says so for the form it falls back to
        return False
    hosted = hosted_stages(program)
    return all(o.attr("stage") or hosted_store(o, hosted) for pt in program.partitions for o in walk(pt.body)
               if o.kind == "store")


def tma_request(template: str, request, opts: Options, whole: bool, field: str):
    """``request`` with ``field`` (kv_tma, dq_tma: gradient tiles stored by TMA) set where its tiles are ``whole`` (no
    tile row in another head) and the stores stage in slots (``_stages_in_slots``), else ``request``."""
    tma = replace(request, **{field: True})
    return tma if whole and _stages_in_slots(template, tma, opts) else request


def _checked(config: str | None, d: int, causal: bool, dq_mode: str, keys: int | None = None) -> str:
    if not any(serves(c, d, dq_mode) for c in CONFIGS):
        raise Unsupported(f"no config serves head dim {d} in the {dq_mode} form without spills (CONFIG_HEAD_DIMS); "
                          f"dq_mode='separate' does")
    config = config or choose_config(d, causal, dq_mode, keys)
    if not serves(config, d, dq_mode):
        raise ValueError(f"attention backward config {config!r} serves head dims "
                         f"{CONFIG_HEAD_DIMS.get(config, {}).get(dq_mode, ())} in the {dq_mode} form, not {d}; use "
                         f"one of {sorted(c for c in CONFIGS if serves(c, d, dq_mode))}")
    return config


class _Plan:
    """What a repeated call needs besides its tensors (``backward``'s fast path): the form, the sizes of what it
    allocates, and the main and dQ kernels' bound launches with the names of their tensor arguments. Built after a
    call that read q, k, v, dO and lse in place; ``run`` returns None (the caller takes the full path) where a bound
    launch cannot serve the call (an address not 16-byte aligned, a launch hook)."""

    def __init__(self, q, k, form: str, values: dict, block_n: int, scale: float, main, dq):
        self.shape_q = tuple(q.shape)
        self.form, self.scale = form, scale
        self.launched = values["NB"] * block_n  # keys of the launched KV blocks (``kernel_values``)
        self.ws = values["dq_acc"].shape[0] // (q.shape[0] * q.shape[1]) if "dq_acc" in values else 0  # rows a head
        self.main, self.dq = main, dq

    def run(self, grad_out, grad_lse, q, k, v, out, lse):
        acc = _workspace(q, self.ws)
        delta, lse2 = rows.preprocess(out, grad_out, lse, grad_lse, workspace=acc)
        dk, dv = kv_buffers(k, self.launched)
        addr = {"q": q.data_ptr(), "k": k.data_ptr(), "v": v.data_ptr(), "do": grad_out.data_ptr(),
                "lse2": lse2.data_ptr(), "delta": delta.data_ptr(), "dk": dk.data_ptr(), "dv": dv.data_ptr()}
        if acc is not None:
            addr["dq_acc"] = acc.data_ptr()
        if not self.main[0](*(addr[n] for n in self.main[1])):
            return None
        if self.form != "separate":
            return rows.postprocess(acc, self.scale, q), dk, dv
        dq = torch.empty(self.shape_q, dtype=q.dtype, device=q.device)
        addr["dq"] = dq.data_ptr()
        if not self.dq[0](*(addr[n] for n in self.dq[1])):
            return None
        return dq, dk, dv


def _workspace(q, rows_per_head: int) -> torch.Tensor | None:
    """The dQ workspace of the atomic and reduce forms, [B*Hq*rows_per_head, D] f32, left uninitialised: the
    preprocess kernel zeroes it beside delta (``attention_bwd_rows.preprocess``); None where the form has none."""
    if not rows_per_head:
        return None
    B, Hq, _, D = q.shape
    return torch.empty(B * Hq * rows_per_head, D, dtype=torch.float32, device=q.device)


#: (a call's metadata, its config arguments, deterministic mode) -> _Plan. The choice tables are read once per key.
_PLANS = BoundCache(256)

#: The tensor arguments a plan can address (``_Plan.run``); a kernel with another one gets no plan.
_PLANNED = {"q", "k", "v", "do", "lse2", "delta", "dk", "dv", "dq_acc", "dq"}


def _remember_plan(key, q, k, form: str, values: dict, block_n: int, scale: float, main, dq=None) -> None:
    """Keep the plan of a call whose kernels were bound (``main``, and ``dq`` in the separate form)."""
    if main is None or (dq is None) != (form != "separate"):
        return
    if set(main[1]) | set(dq[1] if dq else ()) <= _PLANNED:
        _PLANS.put(key, _Plan(q, k, form, values, block_n, scale, main, dq))


#: (plan key) -> whether the measured choice (``backward``'s ``vendor``) runs ours for calls like it.
_CHOSEN = BoundCache(256)


def _decide(grad_out, grad_lse, q, k, v, out, lse, causal: bool, scale: float, vendor):
    """Ours or ``vendor`` for this call: a runtime.choice ``Decision`` (measured on these tensors, cached per key, or
    the prior ``backward_prior`` where nothing may be measured: "prior" mode, a CUDA graph being captured); ours while
    deterministic algorithms are on (its separate form writes every gradient element once; the vendor's is not
    bit-reproducible)."""
    if torch.are_deterministic_algorithms_enabled():
        return choice.Decision(True, "forced")
    B, Hq, Sq, D = q.shape
    Hkv, Skv = k.shape[1], k.shape[2]
    layout = tuple(t.stride(1) < t.stride(2) for t in (q, k, v))  # [B, S, H, D] rows (a transposed view)?
    key = ("attention_backward", str(q.dtype), D, causal, grad_out is not None, grad_lse is not None, Hq, Hkv, layout,
           choice.bucket(B), choice.bucket(Sq), choice.bucket(Skv))
    ours = functools.partial(backward, grad_out, grad_lse, q, k, v, out, lse, causal, scale)
    theirs = functools.partial(vendor, grad_out, grad_lse, q, k, v, out, lse, causal, scale)
    return choice.decide(key, ours, theirs, backward_prior(D, causal, Skv), q.device)


def backward(grad_out, grad_lse, q, k, v, out, lse, is_causal: bool, scale: float, config: str | None = None,
             dq_mode: str | None = None, dq_config: str | None = None, vendor=None):
    """(dq, dk, dv), [B, H, S, D] each (dk/dv with k's heads), of ``(out, lse) = attention(q, k, v, is_causal,
    scale)`` by the generated kernels; ``grad_out`` or ``grad_lse`` may be None (no gradient into it). ``dq_mode``
    "atomic", "reduce" or "separate" forces a form (None: ``choose_dq_mode``); ``config`` / ``dq_config`` name the main
    and the dQ kernel's configs (None: chosen). Raises ``Unsupported`` where ``support_reason`` gives a reason (or for
    the atomic and reduce forms under deterministic algorithms, or a form no config serves at the head dim).
    A call with the metadata, arguments and deterministic mode of an earlier one that read its tensors in place
    takes that call's plan (``_Plan``): no checks or choices again, only the allocations and bound launches.
    ``vendor`` (a function of the same arguments as ``attention_grad.vendor_backward``), with no config or form
    named: the call returns None where the measured choice (``_decide``) keeps the vendor's backward (the caller
    runs it), remembered per call key."""
    choose = vendor is not None and config is None and dq_mode is None and dq_config is None
    plan_key = (_key(grad_out, grad_lse, q, k, v, out, lse, is_causal, scale), config, dq_mode, dq_config,
                torch.are_deterministic_algorithms_enabled(), choose and choice.mode())
    use = _CHOSEN.get(plan_key) if choose else True
    if use is False:
        return None
    plan = _PLANS.get(plan_key)
    if plan is not None and POISON is None:
        got = plan.run(grad_out, grad_lse, q, k, v, out, lse)
        if got is not None:
            return got
    why = support_reason(q, k, v, out, lse, grad_out, is_causal, scale)
    if why:
        raise Unsupported(why)
    D = q.shape[-1]
    causal, scale = bool(is_causal), float(scale)
    if use is None:
        d = _decide(grad_out, grad_lse, q, k, v, out, lse, causal, scale, vendor)
        if d.source != "prior":  # a prior answer (say while a CUDA graph is captured) is asked again next call
            _CHOSEN.put(plan_key, d.use_ours)
        if not d.use_ours:
            return None
    dq_mode = choose_dq_mode(dq_mode, D, k.shape[2], causal)
    config = _checked(config, D, causal, dq_mode, k.shape[2])
    if dq_mode == "separate":
        dq_config = dq_config or choose_dq_config(D, causal)
        if not dq_serves(dq_config, D):
            raise ValueError(f"attention backward dq_config {dq_config!r} does not serve head dim {D}; use one of "
                             f"{sorted(c for c in DQ_CONFIGS if dq_serves(c, D))}")
    elif dq_config is not None:
        raise ValueError(f"dq_config={dq_config!r} is for the separate form; pass dq_mode='separate' with it")
    opts = CONFIGS[config]
    form = "none" if dq_mode == "separate" else dq_mode
    acc = _workspace(q, workspace_rows(form, q.shape[2], opts.block_m))
    delta, lse2 = rows.preprocess(out, grad_out, lse, grad_lse, workspace=acc)
    values = kernel_values(q, k, v, grad_out, delta, lse2, causal, scale, opts.block_n, POISON, dq=form,
                           block_m=opts.block_m, fold=opts.fold_rows, dq_acc=acc)
    in_place = grad_out is not None and all(values[n].data_ptr() == t.data_ptr() for n, t in zip(_VIEWS,
                                                                                                 (q, k, v, grad_out)))
    call = plan_key[0]
    Sq, Skv = q.shape[2], k.shape[2]
    # dK/dV by TMA where every KV tile is whole; not the atomic form (asked for only, never chosen): at d=128 its
    # registers are full at the stores and the staged stores spill more (540 against 440 bytes offline)
    main = tma_request("attention_bwd", AttentionBwdRequest(D, DTYPES[q.dtype], causal, dq=form), opts,
                       Skv % opts.block_n == 0 and form != "atomic", "kv_tma")
    # one CTA per (batch, kv-head) and launched KV block
    _launch("attention_bwd", main, opts, values,
            values["BH"] * values["NB"], call + ("main", config, form), in_place, q.device)
    main_bound = _BOUND.get(call + ("main", config, form))
    if dq_mode != "separate":
        if in_place and POISON is None:
            _remember_plan(plan_key, q, k, dq_mode, values, opts.block_n, scale, main_bound)
        return gradients(values, scale, q, k, post=rows.postprocess)
    dq_opts = DQ_CONFIGS[dq_config]
    dq_values = dq_host.kernel_values(q, k, v, grad_out, delta, lse2, causal, scale, POISON, views=values)
    dq_req = tma_request("attention_bwd_dq", AttentionBwdDqRequest(D, DTYPES[q.dtype], causal), dq_opts,
                         Sq % dq_opts.block_m == 0, "dq_tma")
    # one CTA per (batch, q-head) and block of queries
    _launch("attention_bwd_dq", dq_req, dq_opts, dq_values,
            dq_values["BH"] * dq_host.q_tiles(q.shape[2], dq_opts.block_m), call + ("dq", dq_config), in_place,
            q.device)
    if in_place and POISON is None:
        _remember_plan(plan_key, q, k, dq_mode, values, opts.block_n, scale, main_bound,
                       _BOUND.get(call + ("dq", dq_config)))
    return (dq_host.gradient(dq_values, q), *kv_gradients(values, k))
