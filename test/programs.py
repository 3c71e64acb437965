"""Small Programs shared by the IR, pass and interpreter tests."""
from __future__ import annotations

from torch_autows.interp import POLICIES, Violation, make_instance, run_partitioned
from torch_autows.ir import Options
from torch_autows.templates.gemm import GemmRequest, build

SMALL = Options(block_m=128, block_n=64, block_k=32, stages=3, data_partition=2, persistent=True)


def small_gemm(**kw):
    opts = kw.pop("options", SMALL)
    return build(GemmRequest(256, 128, 96, **kw), opts)


def violation_kinds(program, seeds=4, policies=POLICIES, shape=None) -> list[str]:
    """The violation kind of every (policy, seed) run of a partitioned Program; 'ok' where none was raised."""
    out = []
    for policy in policies:
        for seed in range(seeds):
            inst = make_instance(program, seed, shape=shape)
            try:
                run_partitioned(program, inst.inputs(), policy=policy, seed=seed)
                out.append("ok")
            except Violation as v:
                out.append(v.kind)
    return out


def compile_ws_cubin(program):
    """(kernel, summary) of a partitioned Program compiled offline for sm_90a, after the checks every
    warp-specialized GEMM config must pass: sm_90a PTX, no register spills, SMEM within 227 KB, setmaxnreg and
    wgmma present, one ttg.warp_specialize region."""
    from torch_autows.codegen.compile import compile_offline, summary

    kernel = compile_offline(program)
    s = summary(program, kernel)
    assert ".target sm_90a" in kernel.asm["ptx"]
    assert s["spills"] == 0, f"{program.name}: {s['spills']} bytes spilled"
    assert s["smem_bytes"] <= 232448
    assert s["setmaxnreg"] > 0 and s["wgmma"] > 0
    assert "ttg.warp_specialize" in kernel.asm["ttgir"]
    return kernel, s

