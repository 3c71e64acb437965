"""Every config the runtime can pick compiles offline to a sm_90a cubin with the WS structure we expect."""
from __future__ import annotations

import itertools
import re

import pytest
from programs import assert_in_order

from torch_autows.codegen import gluon
from torch_autows.codegen.compile import compile_offline, summary
from torch_autows.passes import pipeline
from torch_autows.runtime.gemm import CONFIGS, choose_config, serves_swap
from torch_autows.templates.gemm import GemmRequest, build

GEMM_SET = [(4096, 4096, 4096), (8192, 8192, 8192), (8192, 4096, 4096), (8192, 14336, 4096), (8192, 4096, 14336),
            (16384, 1024, 4096), (4096, 128256, 4096)]
VARIANTS = {  # (trans_a, trans_b, bias, batch, dtype, out_dtype)
    "nn": (False, False, False, 1, "bf16", None),
    "tn_bias": (True, False, True, 1, "bf16", None),
    "nt_fp16": (False, True, False, 1, "fp16", None),
    "tt_f32out": (True, True, False, 1, "bf16", "f32"),
    "bmm": (False, False, False, 32, "bf16", None),
}


def test_heuristic_picks_known_configs_for_the_gemm_set():
    assert {choose_config(*s) for s in GEMM_SET} <= set(CONFIGS)


def test_heuristic_counts_waves():
    # 8192 x 768: 192 tiles of 128x256 take 2 rounds on 132 SMs (4 units), 384 of 128x128 take 3 (3.3 units)
    assert choose_config(8192, 768, 3072) == "ws_p_128x128"
    assert choose_config(8192, 768, 3072, sms=192) == "ws_p_128x256"  # one round each: the wider tile
    assert choose_config(4096, 4096, 4096) == "ws_p_128x256"  # 512 vs 1024 tiles: both about 4 rounds per unit
    assert choose_config(1 << 20, 64, 64) == "ws_p_128x128"  # narrow N


@pytest.mark.parametrize("config,variant", [(c, v) for c, v in itertools.product(CONFIGS, VARIANTS)
                                            if (VARIANTS[v][3] == 1 or CONFIGS[c].split_k == 1)  # bmm: no split-K
                                            and serves_swap(c, trans_a=VARIANTS[v][0], trans_b=VARIANTS[v][1],
                                                            batched=VARIANTS[v][3] > 1)])  # swap-AB: nt only
def test_compiles_to_sm90a_with_ws_structure(config, variant):
    ta, tb, bias, batch, dt, odt = VARIANTS[variant]
    program = pipeline.run(build(GemmRequest(4096, 4096, 4096, dt, odt, ta, tb, bias, batch), CONFIGS[config]))
    kernel = compile_offline(program)
    s = summary(program, kernel)
    ptx = kernel.asm["ptx"]
    assert ".target sm_90a" in ptx
    assert len(s["partitions"]) >= 2
    assert s["setmaxnreg"] > 0 and s["wgmma"] > 0
    assert "mbarrier.try_wait" in ptx
    assert s["smem_bytes"] <= 232448
    assert s["spills"] == 0
    assert kernel.asm["cubin"][:4] == b"\x7fELF"
    ttgir = kernel.asm["ttgir"]
    assert "ttg.warp_specialize" in ttgir
    # partition sizes in the TTGIR match the IR's decisions
    workers = [p["warps"] for p in s["partitions"][1:]]
    regs = [p["regs"] for p in s["partitions"][1:]]
    assert f"requestedRegisters = array<i32: {', '.join(map(str, regs))}>" in ttgir
    assert re.findall(r"partition\d+\(.*num_warps\((\d+)\)", ttgir) == [str(w) for w in workers]
    assert re.search(rf"setmaxnreg\.(inc|dec)\.sync\.aligned\.u32 \t{regs[-1]}\b", ptx)  # the producer's budget


def test_generated_source_names_ir_ops_and_partitions():
    program = pipeline.run(build(GemmRequest(512, 512, 512, bias=True), CONFIGS["ws_p_128x256"]))
    src = gluon.generate(program)
    ordered = ["def consumer0(", "# partition consumer0: 4 warps, 232 registers",
               "for tile in range(gl.program_id(0), num_tiles, gl.num_programs(0)):",
               "= zeros() [chain=0 partition=consumer0]  <consumer0>",
               "mbarrier.wait(g0_ready.index(g0_s), (g0_n // 3) & 1)",
               "= mma(%a_c0, %b, %acc_c0) {pending=1}",
               "warpgroup_mma(v_a_c0, v_b, v_acc_c0, is_async=True)",
               "warpgroup_mma_wait(num_outstanding=1",
               "mbarrier.arrive(g0_empty.index((g0_n + 2) % 3), pred=(k - 0) >= 1)",
               "warpgroup_mma_wait(num_outstanding=0", "gl.load(bias_ptr",
               "tma.async_copy_shared_to_global(c_desc, [pid_m * 128, pid_n * 256], out_c0_stage)",
               "def producer(", "mbarrier.wait(g0_empty.index(g0_s), ((g0_n // 3) & 1) ^ 1)",
               "mbarrier.expect(g0_ready.index(g0_s), 49152)",
               "tma.async_copy_global_to_shared(a_desc, [pid_m * 128 + 64, k * 64]",
               f"def {program.name}(", "mbarrier.init(g0_empty.index(i), count=2)",
               "gl.warp_specialize([(consumer0,", "[4, 1], [232, 40])", f"kernel = {program.name}"]
    assert_in_order(src, ordered)


def test_non_persistent_reuse_becomes_reinterpret():
    program = pipeline.run(build(GemmRequest(512, 512, 512), CONFIGS["ws_np_128x256"]))
    src = gluon.generate(program)
    assert "out_stage = b_smem._reinterpret(gl.bfloat16, [128, 256], c_desc.layout)" in src
    assert "tile = gl.program_id(0)" in src


def test_lowering_is_chosen_by_the_programs_arch(monkeypatch):
    """codegen takes the generation's imports, accumulator layout and emitters from ``LOWERINGS[arch.name]``;
    an arch without a lowering module is refused with what to add."""
    from dataclasses import replace
    from types import SimpleNamespace

    from torch_autows.codegen import sm90
    from torch_autows.ir import SM90

    program = pipeline.run(build(GemmRequest(512, 512, 512), CONFIGS["ws_p_128x256"]))
    src = gluon.generate(program)
    assert sm90.IMPORTS in src and sm90.accumulator_layout(4, 256) in src
    other = replace(program, arch=replace(SM90, name="sm_new"))
    with pytest.raises(ValueError, match=r"add codegen/sm_new.py and list it in codegen.gluon.LOWERINGS"):
        gluon.generate(other)
    fake = SimpleNamespace(IMPORTS="import new_arch\n", accumulator_layout=lambda warps, n: f"NEW_ACC({warps}, {n})",
                           EMITTERS={**sm90.EMITTERS, "mma": lambda ctx, o, indent: ["new_mma()"]})
    monkeypatch.setitem(gluon.LOWERINGS, "sm_new", fake)
    new = gluon.generate(other)
    assert "import new_arch\n" in new and sm90.IMPORTS not in new
    assert "MMA_N256: gl.constexpr = NEW_ACC(4, 256)" in new and "new_mma()" in new and "warpgroup_mma(" not in new
