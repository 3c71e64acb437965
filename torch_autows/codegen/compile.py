"""Compile generated Gluon: load the module, compile offline for a target, cache by content.

``load_module(source)`` writes the source to a file named by its hash under ``diskcache.root()``
(Gluon needs real source files), checks that an existing file holds exactly that source, and imports
it. ``compile_offline(program)`` compiles for the program's generation (``GPUTarget("cuda", arch.sm,
32)``, sm_90a for Hopper) without a GPU and returns a ``CompiledKernel`` (asm: ttgir, llir, ptx, cubin).
``summary(program, kernel)`` reads partitions, SMEM, wgmma/setmaxnreg counts and spills (from ptxas -v)
into a dict.
"""
from __future__ import annotations

import atexit
import hashlib
import importlib.util
import linecache
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import types

import triton

from .. import diagnostics, diskcache
from .._version import __version__
from ..ir import SM90, Arch, Program
from .gluon import GL_DTYPE, block_shapes, generate

log = logging.getLogger("torch_autows")


def source_key(source: str, arch: Arch = SM90) -> str:
    """The cache name of generated ``source`` for ``arch``: its hash with triton's and our version."""
    h = hashlib.sha256(f"{source}\0{triton.__version__}\0{__version__}\0sm{arch.sm}".encode()).hexdigest()
    return h[:24]


_modules: dict[str, types.ModuleType] = {}  # key -> a module that loaded and has ``kernel``; nothing else
_key_locks: dict[str, threading.Lock] = {}
_guard = threading.Lock()
_private: str | None = None  # this process's own directory, used when the cache root is unusable


def load_module(source: str, arch: Arch = SM90) -> types.ModuleType:
    """Import generated Gluon ``source`` (its ``kernel`` is the entry point), once per process.

    The source is kept as ``autows_<key>.py`` under ``diskcache.root()`` (Gluon reads a kernel's source
    from its file), where ``<key>`` hashes the source: an existing entry is used only if its text is
    exactly ``source``; a corrupted, truncated, empty or modified entry is rewritten first (logged once).
    When the cache root is unusable the file goes to a private temporary directory instead. Safe to call
    from several threads and processes at once: one thread per key loads, files are replaced atomically,
    and only a module that loaded completely is remembered."""
    key = source_key(source, arch)
    mod = _modules.get(key)
    if mod is not None:
        return mod
    with _guard:
        lock = _key_locks.setdefault(key, threading.Lock())
    with lock:
        mod = _modules.get(key)
        if mod is None:
            mod = _modules[key] = _load(source, key)
    return mod


def _log_once(what: str, key: str, msg: str, *args) -> None:
    diagnostics.faults.log_once(("compile", what, key), msg, *args)


def _private_dir() -> str:
    global _private
    with _guard:
        if _private is None or not os.path.isdir(_private):
            _private = tempfile.mkdtemp(prefix="torch_autows-")
            atexit.register(shutil.rmtree, _private, True)
        return _private


def _entry(directory: str, source: str, key: str) -> str | None:
    """The path of a cache entry holding exactly ``source`` in ``directory`` (written if missing or
    different); None if it cannot be written there."""
    path = os.path.join(directory, f"autows_{key}.py")
    text = diskcache.read_text(path)
    if text == source:
        return path
    if text is not None or os.path.lexists(path):  # present but different, or not even text
        _log_once("mismatch", key, "torch_autows: cache entry %s does not hold the source its name hashes "
                  "(corrupted, truncated or modified); rewriting it", path)
    return path if diskcache.atomic_write(path, source) else None


def _load(source: str, key: str) -> types.ModuleType:
    root = diskcache.root()
    path = _entry(root, source, key) if root is not None else None
    if path is None:
        try:
            path = _entry(_private_dir(), source, key)
        except OSError as e:
            raise OSError(f"cannot write the generated kernel source anywhere (cache root {root!r}, private "
                          f"temporary directory: {e}); set TORCH_AUTOWS_CACHE_DIR to a writable directory") from e
        if path is None:
            raise OSError(f"cannot write the generated kernel source to {_private!r} (the cache root {root!r} is "
                          "unusable too); set TORCH_AUTOWS_CACHE_DIR to a writable directory")
    try:
        return _import(source, key, path)
    except Exception as e:  # the file changed under us (another writer): rewrite it and try once more
        _log_once("import", key, "torch_autows: cache entry %s failed to load (%s: %s); rewriting it",
                  path, type(e).__name__, e)
        if not diskcache.atomic_write(path, source):
            raise
        return _import(source, key, path)


def _import(source: str, key: str, path: str) -> types.ModuleType:
    """Run ``source`` as module ``torch_autows_generated_<key>`` with ``path`` as its file; the file must
    hold ``source`` (Gluon reads each kernel's text from it). Nothing is left in sys.modules on failure."""
    if diskcache.read_text(path) != source:
        raise ImportError(f"{path} does not hold the generated source")
    name = f"torch_autows_generated_{key}"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    linecache.cache.pop(path, None)  # a stale copy of an earlier (bad) version of the file
    sys.modules[name] = mod
    try:
        exec(compile(source, path, "exec"), mod.__dict__)
        if getattr(mod, "kernel", None) is None:
            raise ImportError(f"{path} defines no kernel")
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return mod


def desc_layout(block: tuple[int, ...], dtype: str):
    from triton.experimental.gluon import language as gl

    return gl.NVMMASharedLayout.get_default_for(list(block), eval(GL_DTYPE[dtype], {"gl": gl}))


def signature(program: Program) -> dict[str, str]:
    blocks = block_shapes(program)
    sig = {}
    for a in program.args:
        if a.kind == "tensor":
            block, _ = blocks[a.name]
            tdt = {"bf16": "bf16", "fp16": "fp16", "f32": "fp32"}[a.dtype]
            sig[f"{a.name}_desc"] = f"tensordesc<{tdt}{list(block)},{desc_layout(block, a.dtype)!r}>"
        elif a.kind == "ptr":
            sig[f"{a.name}_ptr"] = "*" + {"bf16": "bf16", "fp16": "fp16", "f32": "fp32", "i32": "i32"}[a.dtype]
        else:
            sig[a.name] = {"f32": "fp32"}.get(a.dtype, a.dtype)
    return sig


def num_warps(program: Program) -> int:
    return program.partitions[0].warps


def compile_options(program: Program) -> dict:
    """Triton's compile options for a partitioned Program: its default partition's warps, and with
    ``Options.ctas_per_sm`` n > 1 the launch's register cap (``maxnreg``: the register file split evenly over the
    threads of n CTAs, each partition padded to whole warpgroups as Triton launches them) so that n CTAs reside on one
    SM; the partitions' setmaxnreg then reallocate within that share (partition_schedule)."""
    opts = {"num_warps": num_warps(program)}
    n = program.options.ctas_per_sm
    if n > 1:
        opts["maxnreg"] = program.arch.regs_per_thread(n, program.arch.cta_threads(p.warps for p in program.partitions))
    return opts


def launch_plan(program: Program):
    """(kernel, {tensor arg: (TMA block, shared layout)}, compile options) for a partitioned Program: what a
    runtime needs to launch it, independent of the tensors' addresses."""
    kernel = load_module(generate(program), program.arch).kernel
    descs = {name: (list(block), desc_layout(block, dtype)) for name, (block, dtype) in block_shapes(program).items()}
    return kernel, descs, compile_options(program)


def compile_offline(program: Program):
    """Compile the Program's Gluon for its generation (sm_<arch.sm>a) without a GPU (ptxas ships with triton)."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    mod = load_module(generate(program), program.arch)
    src = GluonASTSource(mod.kernel, signature(program), {})
    target = GPUTarget("cuda", program.arch.sm, 32)
    return triton.compile(src, target=target, options=compile_options(program))


def compile_as_launched(program: Program):
    """``compile_offline`` with the specialisation a typical launch gets (Triton's: integer arguments divisible by
    16 and 16-byte aligned pointers; the GQA group size ``G`` left open), which the runtime's kernels are compiled
    with on the GPU: its register use and instruction counts are the launched kernel's, not the generic one's."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    sig = signature(program)
    attrs = {(i,): [["tt.divisibility", 16]] for i, (name, ty) in enumerate(sig.items())
             if name != "G" and (ty == "i32" or ty.startswith("*"))}
    src = GluonASTSource(load_module(generate(program), program.arch).kernel, sig, {}, attrs)
    return triton.compile(src, target=GPUTarget("cuda", program.arch.sm, 32),
                          options=compile_options(program))


def sass_per_line(program: Program, kernel) -> dict[int, int]:
    """Line of the generated Gluon (``generate(program)``, 1-based) -> SASS instructions the compiled ``kernel``
    attributes to it (``nvdisasm -g`` on its cubin), to see where a kernel's instructions go without a GPU
    (``python -m torch_autows explain ... --sass``). Line 0: instructions of Triton's library functions the kernel
    inlined (``gl.cdiv``, the reductions' combine steps), whose debug lines name triton's own files."""
    path = load_module(generate(program), program.arch).__file__
    counts: dict[int, int] = {}
    line = None
    for text in sass(kernel, lines=True).splitlines():
        m = re.search(r'//## File "([^"]+)", line (\d+)', text)
        if m:
            line = int(m.group(2)) if os.path.basename(m.group(1)) == os.path.basename(path) else 0
        elif line is not None and re.match(r"\s+/\*[0-9a-f]{4,}\*/\s+\S", text):
            counts[line] = counts.get(line, 0) + 1
    return counts


def sass(kernel, lines: bool = False) -> str:
    """The compiled kernel's SASS (``nvdisasm -c`` on its cubin; nvdisasm ships with triton); ``lines``: with the
    source line of each instruction (``-g``)."""
    from triton import knobs

    with tempfile.TemporaryDirectory() as d:
        cubin = os.path.join(d, "k.cubin")
        with open(cubin, "wb") as f:
            f.write(kernel.asm["cubin"])
        return subprocess.run([knobs.nvidia.nvdisasm.path, "-c", *(["-g"] if lines else []), cubin],
                              capture_output=True, text=True, check=True).stdout


def injected_wgmma_waits(kernel) -> int:
    """wgmma waits ptxas added (``WARPGROUP.DEPBAR`` in the SASS beyond the PTX's ``wgmma.wait_group``): where an
    instruction touches registers of a wgmma in flight, ptxas waits for it there instead of serializing the kernel,
    and the overlap the schedule planned is gone at that point, silently (the d=128 backward with ``fold_rows``: one,
    S^T waited before dP^T's issue)."""
    waits = len(re.findall(r"wgmma\.wait_group", kernel.asm["ptx"]))
    return len(re.findall(r"WARPGROUP\.DEPBAR", sass(kernel))) - waits


def ptxas_info(ptx: str, arch: Arch = SM90) -> dict:
    """Registers, spills and wgmma serialization per ptxas -v on the PTX (the same ptxas triton uses).

    ``serialized``: ptxas's "Potential Performance Loss: wgmma.mma_async instructions are serialized due to ..."
    reasons (C7514 and kin). ptxas then waits for every wgmma right after issuing it, in the whole function: no
    mma overlaps the softmax or another mma, silently (a variant that made it lost 20-28% on the H200)."""
    from triton.backends.nvidia.compiler import get_ptxas

    ptxas = get_ptxas(arch.sm).path
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "k.ptx")
        with open(p, "w") as f:
            f.write(ptx)
        r = subprocess.run([ptxas, "-v", f"--gpu-name=sm_{arch.sm}a", p, "-o", os.path.join(d, "k.cubin")],
                           capture_output=True, text=True)
    log = r.stdout + r.stderr
    spill = [int(x) + int(y) for x, y in re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)]
    regs = [int(x) for x in re.findall(r"Used (\d+) registers", log)]
    serialized = re.findall(r"wgmma\.mma_async instructions are serialized (due to [^\n]*?)(?: in the function|$)",
                            log, re.M)
    return {"spills": sum(spill), "registers": max(regs) if regs else None, "serialized": serialized, "log": log}


def summary(program: Program, kernel) -> dict:
    ptx = kernel.asm["ptx"]
    info = ptxas_info(ptx, program.arch)
    return {
        "kernel": program.name,
        "partitions": [{"name": p.name, "warps": p.warps, "regs": p.regs} for p in program.partitions],
        "smem_bytes": kernel.metadata.shared,
        "smem_plan_bytes": program.smem_bytes,
        "wgmma": len(re.findall(r"wgmma\.mma_async", ptx)),
        "setmaxnreg": len(re.findall(r"setmaxnreg", ptx)),
        "maxnreg": int(m.group(1)) if (m := re.search(r"\.maxnreg (\d+)", ptx)) else None,
        "ctas_per_sm": program.options.ctas_per_sm,
        "total_warps": kernel.metadata.num_warps,
        "spills": info["spills"],
        "wgmma_serialized": info["serialized"],
        "wgmma_waits_injected": injected_wgmma_waits(kernel),
        "arch": f"sm_{program.arch.sm}a",
    }
