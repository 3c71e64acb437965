"""Compile generated Gluon: load the module, compile offline for a target, cache by content.

``load_module(source)`` writes the source to a file under the cache directory (Gluon needs real
source files) named by its hash and imports it. ``compile_offline(program)`` compiles for
``GPUTarget("cuda", 90, 32)`` without a GPU and returns a ``CompiledKernel`` (asm: ttgir, llir,
ptx, cubin). ``summary(program, kernel)`` reads partitions, SMEM, wgmma/setmaxnreg counts and
spills (from ptxas -v) into a dict.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import re
import subprocess
import sys
import tempfile

import triton

from .. import __version__, config
from ..ir import Program
from .gluon import GL_DTYPE, block_shapes, generate

TARGET_ARCH = 90


def cache_dir() -> str:
    d = config.cache_dir or os.path.join(tempfile.gettempdir(), f"torch_autows-{os.getuid()}")
    os.makedirs(d, exist_ok=True)
    return d


def source_key(source: str, arch: int = TARGET_ARCH) -> str:
    h = hashlib.sha256(f"{source}\0{triton.__version__}\0{__version__}\0sm{arch}".encode()).hexdigest()
    return h[:24]


@functools.lru_cache(maxsize=256)
def load_module(source: str):
    key = source_key(source)
    path = os.path.join(cache_dir(), f"autows_{key}.py")
    if not os.path.exists(path):
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(source)
        os.replace(tmp, path)
    name = f"torch_autows_generated_{key}"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
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
            sig[f"{a.name}_ptr"] = "*" + {"bf16": "bf16", "fp16": "fp16", "f32": "fp32"}[a.dtype]
        else:
            sig[a.name] = {"f32": "fp32"}.get(a.dtype, a.dtype)
    return sig


def num_warps(program: Program) -> int:
    return program.partitions[0].warps


def launch_plan(program: Program):
    """(kernel, {tensor arg: (TMA block, shared layout)}, num_warps) for a partitioned Program: what a
    runtime needs to launch it, independent of the tensors' addresses."""
    kernel = load_module(generate(program)).kernel
    descs = {name: (list(block), desc_layout(block, dtype)) for name, (block, dtype) in block_shapes(program).items()}
    return kernel, descs, num_warps(program)


def compile_offline(program: Program, arch: int = TARGET_ARCH):
    """Compile the Program's Gluon for sm_<arch>a without a GPU (ptxas ships with triton)."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    mod = load_module(generate(program))
    src = GluonASTSource(mod.kernel, signature(program), {})
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": num_warps(program)})


def ptxas_info(ptx: str, arch: int = TARGET_ARCH) -> dict:
    """Registers and spills per ptxas -v on the PTX (the same ptxas triton uses)."""
    from triton.backends.nvidia.compiler import get_ptxas

    ptxas = get_ptxas(arch).path
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "k.ptx")
        with open(p, "w") as f:
            f.write(ptx)
        r = subprocess.run([ptxas, "-v", f"--gpu-name=sm_{arch}a", p, "-o", os.path.join(d, "k.cubin")],
                           capture_output=True, text=True)
    log = r.stdout + r.stderr
    spill = [int(x) + int(y) for x, y in re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)]
    regs = [int(x) for x in re.findall(r"Used (\d+) registers", log)]
    return {"spills": sum(spill), "registers": max(regs) if regs else None, "log": log}


def summary(program: Program, kernel) -> dict:
    ptx = kernel.asm["ptx"]
    info = ptxas_info(ptx)
    return {
        "kernel": program.name,
        "partitions": [{"name": p.name, "warps": p.warps, "regs": p.regs} for p in program.partitions],
        "smem_bytes": kernel.metadata.shared,
        "smem_plan_bytes": program.smem_bytes,
        "wgmma": len(re.findall(r"wgmma\.mma_async", ptx)),
        "setmaxnreg": len(re.findall(r"setmaxnreg", ptx)),
        "maxnreg": int(m.group(1)) if (m := re.search(r"\.maxnreg (\d+)", ptx)) else None,
        "total_warps": kernel.metadata.num_warps,
        "spills": info["spills"],
        "arch": f"sm_{TARGET_ARCH}a",
    }
