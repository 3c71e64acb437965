"""Small Programs shared by the IR, pass and interpreter tests, and the fake CUDA tensors the support checks see."""
from __future__ import annotations

import torch

from torch_autows.interp import POLICIES, Violation, make_instance, run_partitioned, run_sequential
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
    assert not s["wgmma_serialized"], f"{program.name}: ptxas serializes its wgmma: {s['wgmma_serialized']}"
    assert s["wgmma_waits_injected"] == 0, f"{program.name}: ptxas adds {s['wgmma_waits_injected']} wgmma waits"
    assert s["smem_bytes"] <= 232448
    assert s["setmaxnreg"] > 0 and s["wgmma"] > 0
    assert "ttg.warp_specialize" in kernel.asm["ttgir"]
    return kernel, s


def assert_in_order(src: str, parts) -> None:
    """Every string of ``parts`` occurs in ``src``, each at or after the previous one's position."""
    pos = 0
    for s in parts:
        i = src.find(s, pos)
        assert i >= 0, f"missing (in order): {s!r}"
        pos = i


def assert_matches_reference(before, after, seed: int, nprog: int) -> list[dict]:
    """Instance ``seed`` of the partitioned Program ``after``: its reference output ``c`` comes out of the
    sequential Program ``before`` and of ``after`` under every policy (``nprog`` CTAs); the inputs of each
    partitioned run, for checks on what it left there (split-K counters)."""
    inst = make_instance(after, seed)
    assert torch.equal(run_sequential(before, inst.inputs())["c"], inst.reference["c"]), inst.desc
    runs = []
    for policy in POLICIES:
        ins = inst.inputs()
        out = run_partitioned(after, ins, policy=policy, seed=seed, nprog=nprog)
        assert torch.equal(out["c"], inst.reference["c"]), (policy, seed, inst.desc)
        runs.append(ins)
    return runs


def fake_cuda(*shape, dtype=torch.bfloat16, stride=None):
    """A fake CUDA tensor (no CUDA needed): what Inductor hands the support checks while tracing."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    meta = torch.empty_strided(shape, stride or torch.empty(shape, device="meta").stride(), dtype=dtype, device="meta")
    return FakeTensor(FakeTensorMode(), meta, torch.device("cuda", 0))
