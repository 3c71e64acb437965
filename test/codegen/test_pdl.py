"""``Options.pdl`` (programmatic dependent launch): every partition of the generated kernel waits for the kernels it
depends on (``griddepcontrol.wait``) before its first statement that can touch global memory, then lets the next
launch start (``griddepcontrol.launch_dependents``); the kernel is compiled with Triton's ``launch_pdl``, so its
launcher sets the launch attribute; ``config.pdl`` gives every runtime kernel the option, and a bound launch made
under the other setting is not reused."""
from __future__ import annotations

import dataclasses
import re

import pytest
from programs import compile_ws_cubin

from torch_autows import config
from torch_autows.codegen import gluon
from torch_autows.passes import pipeline
from torch_autows.runtime import attention as rta
from torch_autows.runtime import gemm as rtg
from torch_autows.runtime import launch
from torch_autows.templates import attention, gemm

WAIT = "griddepcontrol.wait"
LAUNCH = "griddepcontrol.launch_dependents"


def _programs(pdl: bool):
    def opts(o):
        return dataclasses.replace(o, pdl=pdl)

    req = gemm.GemmRequest(1, 1, 1, "bf16", trans_b=True, bias=True)
    return {
        **{c: gemm.build(req, opts(rtg.CONFIGS[c])) for c in ("decs_64x128_m16_s1", "dec_64x128_s2", "ws_p_128x256")},
        "attention": attention.build(attention.AttentionRequest(128, "bf16", True),
                                     opts(rta.CONFIGS["ws_p_128x128_q2_rm_g16"])),
    }


def _partition_bodies(src: str) -> dict[str, list[str]]:
    """Partition function name -> its statement lines (comments and constexpr layout names dropped), from
    generated Gluon."""
    out, name = {}, None
    for line in src.splitlines():
        m = re.match(r"def (\w+)\(", line)
        if m:
            name = m.group(1)
            out[name] = []
        elif name and line.startswith("    ") and not line.strip().startswith("#") and "gl.constexpr =" not in line:
            out[name].append(line.strip())
    return out


@pytest.mark.parametrize("name", sorted(_programs(False)))
def test_every_partition_waits_first_then_lets_the_next_launch(name):
    program = pipeline.run(_programs(True)[name])
    bodies = _partition_bodies(gluon.generate(program))
    for part in program.partitions:
        first = bodies[part.name][:2]
        assert WAIT in first[0] and LAUNCH in first[1], (part.name, first)
    entry = bodies[program.name]
    assert not any("griddepcontrol" in s for s in entry)  # the entry point only allocates and forks


@pytest.mark.parametrize("name", sorted(_programs(False)))
def test_without_the_option_no_grid_dependency(name):
    src = gluon.generate(pipeline.run(_programs(False)[name]))
    assert "griddepcontrol" not in src


@pytest.mark.parametrize("name", ["decs_64x128_m16_s1", "ws_p_128x256", "attention"])
def test_compiles_with_launch_pdl_and_the_same_registers(name):
    """The PTX keeps a wait and a trigger per partition, the kernel is marked launch_pdl, and the option costs no
    register and no spill (two instructions before the partitions' code)."""
    kernel, s = compile_ws_cubin(pipeline.run(_programs(True)[name]))
    base, s0 = compile_ws_cubin(pipeline.run(_programs(False)[name]))
    ptx = kernel.asm["ptx"]
    parts = len(s["partitions"])
    assert ptx.count(WAIT) >= parts and ptx.count(LAUNCH) >= parts
    assert kernel.metadata.launch_pdl and not base.metadata.launch_pdl
    assert s["maxnreg"] == s0["maxnreg"] and s["spills"] == 0


def test_config_pdl_gives_the_runtime_kernels_the_option(monkeypatch):
    req = gemm.GemmRequest(1, 1, 1, "bf16", trans_b=True)
    off = launch.compile_kernel("gemm", req, rtg.CONFIGS["decs_64x128_m16_s1"])
    monkeypatch.setattr(config, "pdl", True)
    on = launch.compile_kernel("gemm", req, rtg.CONFIGS["decs_64x128_m16_s1"])
    assert on.program.options.pdl and not off.program.options.pdl
    assert on.launcher.pdl and not off.launcher.pdl


def test_a_bound_launch_holds_for_the_setting_it_was_made_under(monkeypatch):
    cache = launch.BoundCache(4)
    cache.put("k", "entry")
    assert cache.get("k") == "entry"
    monkeypatch.setattr(config, "pdl", True)
    assert cache.get("k") is None  # the next call builds its launch with the kernel compiled for PDL
    cache.put("k", "pdl entry")
    assert cache.get("k") == "pdl entry"
    monkeypatch.setattr(config, "pdl", False)
    assert cache.get("k") == "entry"


def test_the_launcher_asks_triton_for_the_pdl_launch(monkeypatch):
    seen = []

    class Kernel:
        def __getitem__(self, grid):
            def run(*args, **kw):
                seen.append(kw)
                raise RuntimeError("stop")  # enough: the compile options are what this test reads
            return run

    for pdl in (False, True):
        with pytest.raises(RuntimeError):
            launch.Launcher(Kernel(), [], 4, pdl=pdl)(8, [64], 0)
    assert seen == [{"num_warps": 4}, {"num_warps": 4, "launch_pdl": True}]
