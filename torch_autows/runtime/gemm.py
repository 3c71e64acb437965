"""GEMM runtime: support checks, config choice, compiled-kernel and descriptor caches, launch.

``support_reason(a, b, bias, out_dtype, residual)`` says why a call cannot run the generated kernel (None:
it can); it reads only devices, dtypes, shapes and strides, so it also works on fake tensors.
``gemm``/``bmm`` raise ``Unsupported`` with that reason, else run the kernel built by
``templates.gemm`` -> ``passes.pipeline`` -> ``codegen.gluon`` for the chosen config.

Configs and their choice live in ``gemm_configs`` (re-exported here).
"""
from __future__ import annotations

import functools

import torch

from ..ir import Options
from ..templates.gemm import ACTIVATIONS, GemmRequest
from . import choice, scratch
from . import device as dev
from .fallback import Unsupported
from .gemm_configs import (  # noqa: F401  (re-exported: runtime.gemm is where callers look for them)
    CONFIGS,
    DECODE_TILES,
    RESIDUAL_BLOCK_N,
    SWAP_PICK,
    choose_config,
    decode_candidates,
    decode_configs,
    decode_name,
    decode_pick,
    decode_time,
    residual_options,
    serves_activation,
    serves_residual,
    serves_rope,
    serves_swap,
    swap_serves,
)
from .launch import BoundCache, Tma, compile_kernel

DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "f32"}


def _tma_view(t: torch.Tensor, rows: int, cols: int) -> tuple[bool, str | None]:
    """Can a 2-D [rows, cols] operand be read by TMA as is (False) or as its transpose (True)?"""
    s0, s1 = t.stride()
    es = t.element_size()
    if s1 == 1 and (s0 * es) % 16 == 0 and s0 >= cols:
        return False, None
    if s0 == 1 and (s1 * es) % 16 == 0 and s1 >= rows:
        return True, None
    if rows == 1 or cols == 1:
        return False, "a vector operand (a dim of 1) with strides TMA cannot describe"
    return False, f"strides {tuple(t.stride())} of a [{rows}, {cols}] operand: TMA needs one dim with stride 1 " \
                  f"and the other a multiple of 16 bytes; make it .contiguous()"


def support_reason(a, b, bias=None, out_dtype=None, residual=None, *, check_device: bool = True) -> str | None:
    """Why the generated GEMM cannot serve ``a @ b (+ bias) (+ residual)`` (None: it can). Works on fake tensors."""
    out_dtype = out_dtype or a.dtype
    why = dev.sm90_reason(a.device, check_device)
    if why:
        return why
    if a.dtype not in (torch.bfloat16, torch.float16):
        return f"dtype {a.dtype}; the generated GEMM takes bfloat16 or float16 operands"
    if out_dtype not in (a.dtype, torch.float32):
        return f"out_dtype {out_dtype}; the generated GEMM writes the operand dtype or float32"
    M, K = a.shape[-2], a.shape[-1]
    N = b.shape[-1]
    if min(M, N, K) < 1:
        return "an empty dimension"
    why = dev.alignment_reason(a=a, b=b)
    if why:
        return f"operand {why}"
    if (N * out_dtype.itemsize) % 16:
        return f"N={N}: the output row must be a multiple of 16 bytes for TMA stores"
    if a.dim() == 2:
        for name, t, r, c in (("a", a, M, K), ("b", b, K, N)):
            _, why = _tma_view(t, r, c)
            if why:
                return f"operand {name}: {why}"
    else:
        return _bmm_reason(a, b)
    if bias is not None and (bias.dim() != 1 or bias.stride(0) != 1):
        return "bias must be a contiguous vector [N]"
    if residual is not None:
        return epilogue_operand_reason("residual", residual, M, N, a.dtype) or dev.alignment_reason(residual=residual)
    return None


def epilogue_operand_reason(label: str, t, M: int, N: int, dtype) -> str | None:
    """Why ``t`` cannot be an epilogue's [M, N] operand tile source (None: it can): contiguous, [M, N], ``dtype``
    (the operands'). Works on fake tensors (strides, not ``is_contiguous``; a size-1 dim's stride is free)."""
    if t.dtype != dtype or tuple(t.shape) != (M, N) or (M > 1 and t.stride(0) != N) or (N > 1 and t.stride(1) != 1):
        return (f"{label} {tuple(t.shape)} {t.dtype} with strides {tuple(t.stride())}: the epilogue reads a contiguous "
                f"[M, N] = [{M}, {N}] tensor of the operands' dtype; make it .contiguous()")
    return None


def stored_reason(label: str, t, shape: tuple, dtype) -> str | None:
    """Why a kernel cannot store one of its outputs into ``t`` by TMA (None: it can): a contiguous, 16-byte aligned
    tensor of ``shape`` and ``dtype`` (real tensors)."""
    if tuple(t.shape) != tuple(shape) or t.dtype != dtype or not t.is_contiguous() or t.data_ptr() % 16:
        return (f"{label} {tuple(t.shape)} {t.dtype}: the kernel stores a contiguous 16-byte aligned {list(shape)} "
                f"tensor of {dtype}")
    return None


def _bmm_reason(a, b) -> str | None:
    """bmm flattens batches into rows: tiles must not straddle batches and rows must be TMA-legal."""
    B, M, K = a.shape
    o = CONFIGS[choose_config(B * M, b.shape[2], K, split=False)]
    if M % o.block_m or K % o.block_k:
        return (f"bmm with M={M}, K={K}: batches are flattened into rows, so M must be a multiple of "
                f"{o.block_m} and K of {o.block_k}")
    if a.stride(2) != 1 or b.stride(2) != 1 or a.stride(0) != M * a.stride(1) or b.stride(0) != K * b.stride(1):
        return (f"bmm operands with strides {tuple(a.stride())}, {tuple(b.stride())}: each must be row-major "
                f"with batches contiguous; make them .contiguous()")
    if (a.stride(1) * a.element_size()) % 16 or (b.stride(1) * b.element_size()) % 16:
        return "bmm row strides must be multiples of 16 bytes"
    return None


#: A call's metadata (shapes, strides, dtypes, device, config) -> (launch.Bound, output shape). A repeated
#: call skips the support checks, config choice and plan lookup and passes only its tensors' addresses:
#: everything those steps decide is a function of the key, and Bound checks the addresses' alignment.
_BOUND = BoundCache(1024)


#: A ``_BOUND`` entry for a key whose decision is the vendor's path (runtime.choice): the call returns None.
VENDOR = ("vendor",)


def replay(hit, inputs: list, out, out_dtype, after: list = ()):
    """The output of a call seen before (``hit``: its ``BoundCache`` entry from ``launch_template``), launched
    through its Bound with the tensors in the kernel's argument order: ``inputs``, the output (``out``, or a
    new one), ``after``, then this stream's split-K workspace and counters where the config splits K. None
    where the Bound cannot serve this call (then the full path runs)."""
    a = inputs[0]
    c = out if out is not None else torch.empty(hit[1], device=a.device, dtype=out_dtype)
    addrs = [t.data_ptr() for t in (*inputs, c, *after)]
    if len(hit) > 2:  # split-K: this stream's current workspace and counters
        ws, locks = scratch.get(a.get_device(), *hit[2])
        addrs += [ws.data_ptr(), locks.data_ptr()]
    return c if hit[0](*addrs) else None


def _launch(req: GemmRequest, config: str, a2, b2, c2, bias, M, N, K, device, key, shape, residual=None):
    operands = {n: t for n, t in (("a", a2), ("b", b2), ("c", c2), ("bias", bias), ("r", residual)) if t is not None}
    options = residual_options(config) if residual is not None else CONFIGS[config]
    launch_template(req, options, operands, M, N, K, device, _BOUND, key, shape)


def launch_template(req: GemmRequest, options: Options, operands: dict, M: int, N: int, K: int, device,
                    cache: BoundCache, key, shape, accumulators: int = 1) -> None:
    """Launch the GEMM template's kernel for ``req`` and ``options`` (runtime.gemm, runtime.swiglu and
    runtime.gemm_rope): ``operands`` by the Program's argument names, each passed as its argument is declared (a
    "tensor" through a TMA descriptor, a "ptr" as a pointer: a swap-AB kernel's C, an epilogue operand without
    ``Options.epilogue_tma``); a split-K config gets this stream's workspace (``accumulators`` slots per part of
    every output tile) and counters. The launch is remembered in ``cache`` under ``key`` (with ``shape``, the
    output's)."""
    try:  # no directory to write the kernel source to (or another OSError): torch serves the call, with why
        kernel = compile_kernel("gemm", req, options)
        launcher, persistent = kernel.launcher, kernel.program.grid.persistent
    except OSError as e:
        raise Unsupported(f"could not build the kernel: {e}") from e
    o = options
    kinds = {a.name: a.kind for a in kernel.program.args}
    values = {name: Tma(t, t.shape, t.stride()) if kinds[name] == "tensor" else t for name, t in operands.items()}
    values.update(M=M, N=N, K=K)
    idx = dev.index(device)
    tiles = req.batch * -(-M // o.block_m) * -(-N // o.block_n)
    extra = ()
    if o.split_k > 1:  # passes/split_k: a workspace slot per accumulator and part of every tile, a counter per tile
        extra = ((accumulators * o.split_k * tiles * o.block_m * o.block_n, tiles),)
        values["ws"], values["locks"] = scratch.get(idx, *extra[0])
    args = launcher.ordered(values)  # by the Program's argument names
    grid = dev.grid(tiles * o.split_k, persistent, idx, o.ctas_per_sm)
    try:  # the first launch of a specialisation compiles it (Triton's cache may be unwritable)
        launcher(grid, args, idx)
    except OSError as e:
        raise Unsupported(f"could not compile the kernel: {e}") from e
    cache.remember(key, launcher, grid, args, idx, shape, *extra)


def _out_reason(out) -> str | None:
    if out is not None and out.data_ptr() % 16:
        return "out is not 16-byte aligned (TMA stores need 16)"
    return None


def vendor_gemm(a, b, bias, out, activation: str = "none"):
    """What ``torch.compile``'s default runs for this GEMM: cuBLAS through aten, into ``out``; an activation is
    then torch's pointwise gelu over the output (in place: one read and one write, as Inductor's kernel)."""
    if a.dim() == 3:
        return torch.bmm(a, b, out=out)
    c = torch.addmm(bias, a, b, out=out) if bias is not None else torch.mm(a, b, out=out)
    return c if activation == "none" else torch.ops.aten.gelu_(c, approximate=ACTIVATIONS[activation])


def site_decision(a, b, bias=None, out_dtype=None, residual=None, activation: str = "none") -> choice.Decision:
    """The choice for a GEMM site seen at compile time with static sizes (``a``, ``b``, ``bias`` may be fake):
    made on real random tensors of the same sizes, strides and dtypes on the same GPU, so the compiled graph
    can keep the vendor's call where it is faster. The support checks must have passed."""
    out_dtype = out_dtype or a.dtype
    a, b = choice.materialize(a), choice.materialize(b)
    bias = choice.materialize(bias) if bias is not None else None
    residual = choice.materialize(residual) if residual is not None else None
    if a.dim() == 3:
        B, M, K = a.shape
        return _decide("bmm", a, b, None, out_dtype, B * M, b.shape[2], K, B)
    M, K = a.shape
    N = b.shape[1]
    return _decide("mm", a, b, bias, out_dtype, M, N, K, (_tma_view(a, M, K)[0], _tma_view(b, K, N)[0]), residual,
                   activation)


def _decide(op, a, b, bias, out_dtype, m, n, k, layout, residual=None, activation="none") -> choice.Decision:
    """The measured / cached / prior choice (runtime.choice) between our kernel and cuBLAS for this call."""
    key = (op, str(a.dtype), str(out_dtype), layout, bias is not None, choice.bucket(m), n, k)
    if residual is not None:  # (the key of a call without one stays as it was: the choice cache holds those)
        key += ("residual",)
    if activation != "none":
        key += (activation,)
    scratch: dict[str, torch.Tensor] = {}  # outputs for the measurement, allocated only if it runs

    def out(side: str) -> torch.Tensor:
        if side not in scratch:
            scratch[side] = torch.empty(_out_shape(a, b), device=a.device, dtype=out_dtype)
        return scratch[side]

    fn = bmm if op == "bmm" else functools.partial(gemm, bias=bias, residual=residual, activation=activation)

    def ours(cfg="auto"):
        return fn(a, b, out_dtype=out_dtype, config=cfg, out=out("ours"))

    if op == "mm" and residual is None and activation == "none":
        cands = decode_candidates(m, n, k, swap_serves(trans_a=layout[0], trans_b=layout[1]))
    else:
        cands = []
    runs = {c: functools.partial(ours, c) for c in cands} if len(cands) > 1 else ours

    def vendor():
        # A residual site is timed against the GEMM plus one read of R: torch.compile's default adds the residual
        # inside the next pointwise kernel (the norm reads x and o, writes h = x + o and its output), where the
        # fused path's norm reads h alone (our epilogue read x and wrote h): the two paths differ by exactly one
        # read of an [M, N] tensor, which the read of R here costs (a standalone add would cost the default two
        # more). Not cuBLAS adding C with beta=1 (H200, 8192x768x768: 46.6 us against 21.8 for the GEMM alone,
        # which made a losing fusion look like a win), and a site not measured faster keeps the default's graph.
        c = vendor_gemm(a, b, bias, out("vendor"), activation)
        if residual is not None:
            residual.sum(dtype=torch.float32)
        return c

    return choice.decide(key, runs, vendor if out_dtype == a.dtype else None, choice.gemm_prior(m, n, k), a.device)


def swap_fits(ta: bool, tb: bool, out, epilogue: str = "none") -> bool:
    """Whether a call may run a swap-AB config: nn.Linear's layout and kind (``swap_serves``) and a contiguous
    ``out`` or none (the swapped tile is C^T's, stored by pointers into a contiguous [M, N])."""
    return swap_serves(trans_a=ta, trans_b=tb, epilogue=epilogue) and (out is None or out.is_contiguous())


def _measured_config(d: choice.Decision, ta: bool, tb: bool, out, configs: dict = CONFIGS) -> str | None:
    """The config of ``configs`` the measured decision ``d`` kept, where this call can run it (a swap-AB config
    needs ``swap_fits``); None: the heuristic's."""
    cfg = d.config
    if cfg not in configs or (configs[cfg].swap_ab and not swap_fits(ta, tb, out)):
        return None
    return cfg


def _out_shape(a, b) -> tuple:
    return (*a.shape[:-1], b.shape[-1])


def gemm(a, b, bias, out_dtype, config: str | None = None, out: torch.Tensor | None = None, residual=None,
         activation: str = "none"):
    """``act(a @ b (+ bias)) (+ residual)`` by the generated kernel, into ``out`` if given. ``config`` None: the
    vendor's path where runtime.choice decides it is faster, and then None is returned (the caller runs torch); a config
    name (or "auto": the heuristic's) always runs our kernel."""
    key = ("mm", a.shape, a.stride(), a.dtype, a.device, b.shape, b.stride(), b.dtype, out_dtype, config,
           bias is not None and (bias.shape, bias.stride(), bias.dtype),
           out is not None and (out.shape, out.stride(), out.dtype), config is None and choice.mode())
    if residual is not None:
        key += ((residual.shape, residual.stride(), residual.dtype),)
    if activation != "none":
        key += (activation,)
    hit = _BOUND.get(key)
    if hit is VENDOR:
        return None
    if hit is not None:
        c = replay(hit, [a, b], out, out_dtype, [t for t in (bias, residual) if t is not None])
        if c is not None:
            return c
    out32 = out_dtype is not None and out_dtype.itemsize > a.dtype.itemsize
    if residual is not None and config not in (None, "auto") and not serves_residual(config, out32):
        o = CONFIGS[config]
        raise Unsupported(f"config {config} ({o.block_n}-wide tiles{', swap-AB' if o.swap_ab else ''}"
                          f"{', split-K' if o.split_k > 1 else ''}) does not serve a residual"
                          f"{' with a ' + str(out_dtype) + ' output' if out32 else ''}: a swap-AB tile stores the "
                          f"product only, split-K loads R by pointers, which spill on tiles wider than "
                          f"{RESIDUAL_BLOCK_N}, and a wider output needs SMEM a 256-wide tile does not have "
                          f"(runtime.gemm_configs.serves_residual); name another config, or config='auto'")
    if config not in (None, "auto") and not serves_activation(config, activation):
        why = "a swap-AB tile stores the (biased) product only" if CONFIGS[config].swap_ab else \
            "its registers would spill"
        raise Unsupported(f"config {config} does not serve activation {activation!r}: {why} "
                          f"(runtime.gemm.serves_activation); name a config that serves it, or config='auto'")
    if config not in (None, "auto") and CONFIGS[config].swap_ab and a.dim() == 2 and b.dim() == 2:
        ta, tb = _tma_view(a, *a.shape)[0], _tma_view(b, *b.shape)[0]
        if not serves_swap(config, trans_a=ta, trans_b=tb):
            raise Unsupported(f"config {config} is swap-AB: it serves a row-major a and b = w.t() of a row-major w "
                              f"(nn.Linear's layout); got a {'transposed' if ta else 'row-major'} a and a "
                              f"{'transposed' if tb else 'row-major'} b; name a config without swap_ab, or "
                              f"config='auto'")
        if out is not None and not out.is_contiguous():
            raise Unsupported(f"config {config} is swap-AB: it stores C by pointers into a contiguous [M, N] output; "
                              f"out has strides {tuple(out.stride())}; pass a contiguous out or none")
    why = support_reason(a, b, bias, out_dtype, residual) or _out_reason(out)
    if why:
        raise Unsupported(why)
    M, K = a.shape
    N = b.shape[1]
    ta, _ = _tma_view(a, M, K)
    tb, _ = _tma_view(b, K, N)
    if config is None:
        d = _decide("mm", a, b, bias, out_dtype, M, N, K, (ta, tb), residual, activation)
        if not d.use_ours:
            _BOUND.put(key, VENDOR)
            return None
        config = _measured_config(d, ta, tb, out)
    config = None if config == "auto" else config
    a2 = a.t() if ta else a
    b2 = b.t() if tb else b
    c = out if out is not None else torch.empty((M, N), device=a.device, dtype=out_dtype)
    swap = residual is None and swap_fits(ta, tb, out, activation)
    config = config or choose_config(M, N, K, residual=residual is not None, activation=activation, swap=swap,
                                     out32=out32)
    # Kernels take M, N, K at run time: the request that keys the compiled kernel leaves them at 1.
    req = GemmRequest(1, 1, 1, DTYPES[a.dtype], DTYPES[out_dtype], ta, tb, bias is not None,
                      residual=residual is not None, activation=activation)
    _launch(req, config, a2, b2, c, bias, M, N, K, a.device, key, (M, N), residual)
    return c


def bmm(a, b, out_dtype, config: str | None = None, out: torch.Tensor | None = None):
    """Batched ``a @ b``; ``config`` and the None result as for ``gemm``."""
    key = ("bmm", a.shape, a.stride(), a.dtype, a.device, b.shape, b.stride(), b.dtype, out_dtype, config,
           out is not None and (out.shape, out.stride(), out.dtype), config is None and choice.mode())
    hit = _BOUND.get(key)
    if hit is VENDOR:
        return None
    if hit is not None:
        c = replay(hit, [a, b], out, out_dtype)
        if c is not None:
            return c
    why = support_reason(a, b, None, out_dtype) or _out_reason(out)
    if why:
        raise Unsupported(why)
    B, M, K = a.shape
    N = b.shape[2]
    if config is None and not _decide("bmm", a, b, None, out_dtype, B * M, N, K, B).use_ours:
        _BOUND.put(key, VENDOR)
        return None
    config = None if config == "auto" else config
    cfg = config or choose_config(B * M, N, K, split=False)
    o = CONFIGS[cfg]
    if not serves_swap(cfg, trans_a=False, trans_b=False, batched=True):
        raise Unsupported(f"config {cfg} is swap-AB, which serves 2-D GEMMs of nn.Linear's layout only; name a "
                          f"config without swap_ab for bmm")
    if o.split_k > 1:
        raise Unsupported(f"config {cfg} splits K across CTAs, which serves 2-D GEMMs only; name a config with "
                          f"split 1 for bmm")
    if M % o.block_m or K % o.block_k:  # an explicit config may have other tiles than the heuristic's
        raise Unsupported(f"bmm with M={M}, K={K} does not tile by {o.block_m}x{o.block_k} ({cfg})")
    a2 = a.reshape(B * M, K)
    b2 = b.reshape(B * K, N)
    c = out if out is not None else torch.empty((B, M, N), device=a.device, dtype=out_dtype)
    req = GemmRequest(1, 1, 1, DTYPES[a.dtype], DTYPES[out_dtype], False, False, False, B)
    _launch(req, cfg, a2, b2, c.view(B * M, N), None, M, N, K, a.device, key, (B, M, N))
    return c
