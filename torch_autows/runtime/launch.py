"""Launch a generated kernel with as little host work per call as Triton allows.

``kernel[grid](...)`` costs tens of microseconds per call: Triton binds and specialises the
arguments, looks the kernel up by that key, builds ``TensorDescriptor`` objects and encodes a
fresh ``CUtensorMap`` for every descriptor on every call. For the sizes models run (a 4096x4096
GEMM takes about 0.2 ms) that host time shows up end to end.

``Launcher`` pays that once: the first call goes through ``kernel[grid]`` (which compiles and
loads the kernel), later calls go straight to the compiled kernel's C launcher with
``CUtensorMap``s cached by (address, shape, strides). A ``CUtensorMap`` is a pure function of
that key and the kernel's block/swizzle metadata, and it holds no reference to the tensor, so a
cached map is exact for any tensor with the same key (the caching allocator hands the same
address back all the time).

The direct path uses two Triton 3.6 internals: the C launcher kept in the closure of
``CudaLauncher.launch`` and ``make_tensordesc_arg`` (which encodes a map from the kernel's
``tensordesc_meta``). If either is not there (another Triton), a launch hook is installed
(profilers) or the kernel needs scratch memory, every call takes the ``kernel[grid]`` path;
``Launcher.direct`` says which path is in use. Triton compiles one kernel per specialisation of
the scalar and pointer arguments (1 becomes a constant; divisibility by 16 and alignment become
attributes), so the direct state is kept per specialisation key, computed with Triton's own
``native_specialize_impl``; a new key takes the ``kernel[grid]`` path once.

``Launcher.bind`` goes one step further for the runtimes' per-shape caches: a ``Bound`` launch has the
kernel, grid, scalars and each descriptor's shape and strides fixed, so a call passes only the tensors'
addresses (one list copy, a map lookup per descriptor, the C launcher).
"""
from __future__ import annotations

import functools
import os

import torch


class Tma:
    """A tensor argument the kernel reads or writes through a host TMA descriptor: the tensor
    (its address), and the global shape and strides the descriptor describes."""

    __slots__ = ("tensor", "shape", "strides")
    padding = "zero"  # read by make_tensordesc_arg, like ``base`` below

    def __init__(self, tensor: torch.Tensor, shape: tuple[int, ...], strides: tuple[int, ...]):
        self.tensor, self.shape, self.strides = tensor, tuple(shape), tuple(strides)

    @property
    def base(self) -> torch.Tensor:
        return self.tensor


_MAP_CACHE_MAX = 1024


class Launcher:
    """One compiled kernel: ``launcher(grid, args)`` with ``Tma`` entries for descriptor args, ``args`` in the
    kernel's argument order; ``launcher.ordered({name: value})`` puts values given by name in that order."""

    def __init__(self, kernel, descs: list, num_warps: int, names: tuple[str, ...] = (),
                 aliases: dict[str, str] | None = None, maxnreg: int | None = None):
        self.kernel = kernel          # the @gluon.jit function
        self.descs = descs            # (block, layout) per Tma argument, in argument order
        self.num_warps = num_warps
        self.maxnreg = maxnreg        # a register cap (Options.ctas_per_sm > 1), else None
        self.names = tuple(names)     # the kernel's arguments (Program.args), in order
        self.aliases = dict(aliases or {})  # arg -> the arg whose value it takes (Arg.alias: another block shape)
        self._direct: dict[tuple, tuple | None] = {}  # (device, specialisation) -> direct state (None: slow)
        self._maps: dict = {}

    def ordered(self, values: dict) -> list:
        """The launch arguments ``values`` (argument name -> value) in the kernel's order; a ValueError naming
        every missing and extra name where they do not match the kernel's arguments exactly. An aliasing argument
        (``Arg.alias``) takes its alias's value (the same ``Tma``: one tensor, a descriptor per block shape)."""
        if self.aliases:
            values = {**{a: values[b] for a, b in self.aliases.items() if b in values}, **values}
        if len(values) == len(self.names):
            try:
                return [values[n] for n in self.names]
            except KeyError:
                pass
        missing = [n for n in self.names if n not in values]
        extra = [n for n in values if n not in self.names]
        raise ValueError(f"launch arguments do not match the kernel's {list(self.names)}: missing {missing}, "
                         f"extra {extra}; pass exactly the names of the Program's args")

    @property
    def direct(self) -> bool:
        return any(v is not None for v in self._direct.values())

    def __call__(self, grid: int, args: list, device_index: int):
        # Triton compiles one kernel per specialisation of the scalar and pointer arguments (an int equal
        # to 1 becomes a constant, divisibility by 16 and pointer alignment become attributes): the
        # direct path must use the kernel compiled for exactly this key
        key = (device_index, *(_specialization(a) for a in args if not isinstance(a, Tma)))
        state = self._direct.get(key, False)
        if state is False or state is None or _hooks_installed():
            self._slow(grid, args, key, first=state is False)
            return
        raw, metas = state[0], state[5]
        flat = []
        slot = 0
        for a in args:
            if isinstance(a, Tma):
                flat += self._map(a, slot, metas[slot])
                slot += 1
            else:
                flat.append(a)
        stream = torch._C._cuda_getCurrentRawStream(device_index)
        raw(grid, 1, 1, stream, *_fixed_args(state), *flat)

    def bind(self, grid: int, args: list, device_index: int) -> Bound | None:
        """This launch with only the tensors' addresses left open (``Bound``), or None where the direct path
        is not in use for its specialisation (yet: the first call of a key compiles through kernel[grid])
        or a tensor is not 16-byte aligned (alignment is part of the specialisation)."""
        key = (device_index, *(_specialization(a) for a in args if not isinstance(a, Tma)))
        state = self._direct.get(key)
        if state is None or state is False:
            return None
        tensors = [a.tensor if isinstance(a, Tma) else a for a in args if isinstance(a, (Tma, torch.Tensor))]
        if any(t.data_ptr() % 16 for t in tensors):
            return None
        return Bound(state, grid, args, device_index, self._map, self._srcs(args))

    def _srcs(self, args: list) -> list[int] | None:
        """The address index of each descriptor / pointer argument for ``Bound``: an aliasing argument shares its
        alias's; None without aliases (one address each, in order)."""
        if not self.aliases:
            return None
        index: dict[str, int] = {}
        for name, a in zip(self.names, args):
            if isinstance(a, (Tma, torch.Tensor)) and name not in self.aliases:
                index[name] = len(index)
        return [index[self.aliases.get(name, name)] for name, a in zip(self.names, args)
                if isinstance(a, (Tma, torch.Tensor))]

    def _map(self, a: Tma, slot: int, meta):
        key = (slot, a.tensor.data_ptr(), a.shape, a.strides)
        m = self._maps.get(key)
        if m is None:
            from triton.backends.nvidia.driver import make_tensordesc_arg

            if len(self._maps) >= _MAP_CACHE_MAX:
                self._maps.clear()
            m = self._maps[key] = make_tensordesc_arg(a, meta)
        return m

    def _slow(self, grid: int, args: list, key: tuple, first: bool):
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

        descs = iter(self.descs)
        call = []
        for a in args:
            if isinstance(a, Tma):
                block, layout = next(descs)
                call.append(TensorDescriptor(a.tensor, list(a.shape), list(a.strides), block, layout))
            else:
                call.append(a)
        if first:
            use_inductor_triton_cache(key[0])
        extra = {"maxnreg": self.maxnreg} if self.maxnreg else {}
        compiled = self.kernel[(grid,)](*call, num_warps=self.num_warps, **extra)
        if first:
            if len(self._direct) >= _MAP_CACHE_MAX:
                self._direct.clear()
            self._direct[key] = _direct_state(compiled, len(self.descs))


def use_inductor_triton_cache(device_index: int) -> None:
    """Compile into the Triton cache directory Inductor's own kernels use. Inductor sets ``TRITON_CACHE_DIR`` when
    it builds its first kernel of a process, if unset (``CachingAutotuner``); a kernel of ours first compiled
    before that (a compile-time choice measurement) was cached under Triton's default directory instead, so the
    next process, whose first launch came after Inductor's, built it again, C launcher included (gcc, about
    0.2 s a kernel: the gap of a warm autows compile against default's on the H200). Set as Inductor would."""
    if os.getenv("TRITON_CACHE_DIR") is None:
        from torch._inductor.runtime.cache_dir_utils import triton_cache_dir

        os.environ["TRITON_CACHE_DIR"] = triton_cache_dir(device_index)


class _At:
    """What ``make_tensordesc_arg`` reads of a descriptor argument, with the tensor given by its address."""

    __slots__ = ("addr", "shape", "strides")
    padding = "zero"

    def __init__(self, addr: int, shape: tuple, strides: tuple):
        self.addr, self.shape, self.strides = addr, shape, strides

    @property
    def base(self):
        return self

    def data_ptr(self) -> int:
        return self.addr


class Bound:
    """One kernel launch with the kernel, grid, scalars and descriptor shapes fixed (``Launcher.bind``).

    ``bound(*addresses)`` takes the data pointers of the launch's tensor arguments (descriptor and pointer
    arguments, in argument order) and launches on the current stream; it returns False, launching nothing,
    when it cannot serve the call (an address not 16-byte aligned, which would change the kernel's
    specialisation, or a launch hook installed): the caller then takes the ``Launcher`` path. Each
    descriptor's ``CUtensorMap`` is cached by address, as ``Launcher`` does."""

    __slots__ = ("_raw", "_head", "_mid", "_flat", "_slots", "_device")

    def __init__(self, state, grid: int, args: list, device_index: int, encode, srcs: list[int] | None = None):
        metas = state[5]
        self._raw, self._head, self._device = state[0], (grid, 1, 1), device_index
        self._mid = _fixed_args(state)
        self._flat: list = []
        # (position in flat, address -> CUtensorMap (None: a pointer), meta, Tma, which address): an aliasing Arg
        # (the same tensor through a second descriptor) takes its alias's address (``srcs``: the address index of
        # each descriptor or pointer argument; None: one address each, in order)
        self._slots: list[tuple] = []
        desc, n = 0, 0
        for a in args:
            if isinstance(a, (Tma, torch.Tensor)):
                src = srcs[n] if srcs is not None else n
                n += 1
            if isinstance(a, Tma):
                entry = encode(a, desc, metas[desc])  # [map, *shape, *strides], from the Launcher's cache
                self._slots.append((len(self._flat), {a.tensor.data_ptr(): entry[0]}, metas[desc],
                                    (a.shape, a.strides), src))
                self._flat += entry
                desc += 1
            elif isinstance(a, torch.Tensor):
                self._slots.append((len(self._flat), None, None, None, src))
                self._flat.append(a.data_ptr())
            else:
                self._flat.append(a)

    def __call__(self, *addrs: int) -> bool:
        if _hooks_installed():
            return False
        flat = self._flat.copy()
        for pos, maps, meta, at, src in self._slots:
            addr = addrs[src]
            if addr & 15:
                return False
            if maps is None:
                flat[pos] = addr
                continue
            m = maps.get(addr)
            if m is None:
                from triton.backends.nvidia.driver import make_tensordesc_arg

                if len(maps) >= 64:
                    maps.clear()
                m = maps[addr] = make_tensordesc_arg(_At(addr, *at), meta)[0]
            flat[pos] = m
        self._raw(*self._head, torch._C._cuda_getCurrentRawStream(self._device), *self._mid, *flat)
        return True


class BoundCache(dict):
    """A runtime's per-call cache: metadata key -> (Bound, *what the call needs besides it), cleared when it
    holds ``limit`` entries."""

    def __init__(self, limit: int):
        super().__init__()
        self.limit = limit

    def remember(self, key, launcher: Launcher, grid: int, args: list, device_index: int, *extra) -> None:
        """Keep ``launcher.bind(...)`` for ``key`` where the launch can be bound."""
        bound = launcher.bind(grid, args, device_index)
        if bound is not None:
            self.put(key, (bound, *extra))

    def put(self, key, entry) -> None:
        if len(self) >= self.limit:
            self.clear()
        self[key] = entry


class JitLaunches:
    """Launches of a plain ``@triton.jit`` kernel (the attention backward's row kernels) through a ``Bound`` after
    the first launch of each key: ``kernel[grid](...)`` re-binds and re-specialises every argument in Python on
    every call (about 35 us of CPU on the H200's host), the bound launch passes the new call's tensor addresses to
    the C launcher. ``launch(kernel, grid, args, key, device_index)``: ``args`` every argument of the kernel in its
    signature order, constexprs included; ``key`` fixes all but the tensors' addresses (the scalars, the constexprs
    and the tensors' dtypes), and a tensor address not 16-byte aligned, a launch hook or a kernel that needs
    scratch memory takes ``kernel[grid]`` again."""

    def __init__(self, limit: int = 256):
        self._bound = BoundCache(limit)

    def launch(self, kernel, grid: int, args: tuple, key, device_index: int) -> None:
        key = (key, grid, device_index)
        hit = self._bound.get(key)
        if hit is not None and hit[0](*(a.data_ptr() for a in args if isinstance(a, torch.Tensor))):
            return
        compiled = kernel[(grid,)](*args)
        state = _direct_state(compiled, 0) if hit is None else None
        if state is not None and not any(a.data_ptr() % 16 for a in args if isinstance(a, torch.Tensor)):
            self._bound.put(key, (Bound(state, grid, list(args), device_index, None),))


def _fixed_args(state) -> tuple:
    """The C launcher's arguments between the stream and the kernel's own, from a direct state: function,
    cooperative / PDL flags, packed metadata; no launch metadata or hooks (the direct path runs without)."""
    _, function, packed, coop, pdl, _ = state
    return (function, coop, pdl, None, None, packed, None, None, None)


_native_specialize = None


def _specialization(arg):
    """Triton's own specialisation of a non-descriptor argument (type and key, e.g. ('i32', 'D'))."""
    global _native_specialize
    if _native_specialize is None:
        from triton._C.libtriton import native_specialize_impl
        from triton.backends.compiler import BaseBackend

        _native_specialize = functools.partial(native_specialize_impl, BaseBackend)
    return _native_specialize(arg, False, True, True)


@functools.cache
def _knobs():
    from triton import knobs  # imported on first launch, not with this module (it loads without triton)

    return knobs


def _hooks_installed() -> bool:
    """Has anyone (a profiler such as proton) installed a launch hook? Triton 3.6 keeps the hooks in
    an always-present ``HookChain``; an empty chain is no hook."""
    knobs = _knobs()
    return any(h is not None and getattr(h, "calls", True) for h in (knobs.runtime.launch_enter_hook,
                                                                     knobs.runtime.launch_exit_hook))


def _direct_state(compiled, n_desc: int):
    """(C launcher, function, packed metadata, cooperative, pdl, tensordesc metas) or None."""
    try:
        launcher = compiled.run
        fn = launcher.launch
        if getattr(fn, "__code__", None) is None:  # no descriptor argument: Triton's launch is the C launcher itself
            raw = fn
        else:  # wrap_handle_tensordesc's closure around it
            cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or ()))
            raw = cells["launcher"].cell_contents
        metas = compiled.metadata.tensordesc_meta
        if (launcher.global_scratch_size or launcher.profile_scratch_size or (metas is None and n_desc)
                or len(metas or ()) != n_desc or not callable(raw)):
            return None
        return (raw, compiled.function, compiled.packed_metadata, launcher.launch_cooperative_grid,
                launcher.launch_pdl, list(metas or ()))
    except (AttributeError, KeyError, TypeError):
        return None


class Kernel:
    """A compiled template instance: the pipeline's ``trace`` ((stage, Program) after every stage), the final
    ``program`` and, loaded on first use (it writes and imports the Gluon), its ``launcher``."""

    def __init__(self, trace: tuple):
        self.trace = trace
        self.program = trace[-1][1]

    @functools.cached_property
    def launcher(self) -> Launcher:
        return launcher_for(self.program)


@functools.lru_cache(maxsize=256)
def compile_kernel(template: str, request, options) -> Kernel:
    """The Kernel of ``templates.TEMPLATES[template]`` for ``request`` and ``options`` (runtime.gemm,
    runtime.attention and the CLI all build kernels here): template -> passes.pipeline, once per key."""
    from ..passes import pipeline
    from ..templates import template as lookup

    if not isinstance(request, lookup(template).request):
        raise TypeError(f"template {template!r} takes a {lookup(template).request.__name__}, not {request!r}")
    trace: list = []
    pipeline.run(lookup(template).build(request, options), trace=trace)
    return Kernel(tuple(trace))


def launcher_for(program) -> Launcher:
    """The Launcher of a partitioned Program (descriptor args in the Program's argument order; ``ordered``
    binds values by the Program's argument names)."""
    from ..codegen.compile import launch_plan

    kernel, descs, options = launch_plan(program)
    return Launcher(kernel, [descs[a.name] for a in program.args if a.kind == "tensor"], options["num_warps"],
                    tuple(a.name for a in program.args), {a.name: a.alias for a in program.args if a.alias},
                    options.get("maxnreg"))
