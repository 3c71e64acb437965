"""Tile consumers in Gluon: each consumer walks every other tile of its CTA, seeks its ring counter to its tile's
first fill and takes its main-loop turn; both ping-pong configs compile offline for sm_90a without spills."""
from __future__ import annotations

import pytest
from programs import assert_in_order, compile_ws_cubin

from torch_autows.codegen import gluon
from torch_autows.passes import pipeline
from torch_autows.runtime.gemm import CONFIGS
from torch_autows.templates.gemm import GemmRequest, build

PP = ("ws_pp2_128x128", "ws_pp2_64x256")


def _fn(src: str, name: str) -> str:
    start = src.index(f"def {name}(")
    return src[start:src.index("@gluon.jit", start)]


def test_each_consumer_walks_its_share_and_seeks_its_ring():
    src = gluon.generate(pipeline.run(build(GemmRequest(1, 1, 1), CONFIGS["ws_pp2_128x128"])))
    c0, c1, prod = (_fn(src, n) for n in ("consumer0", "consumer1", "producer"))
    assert "for tile in range(gl.program_id(0), num_tiles, 2 * gl.num_programs(0)):" in c0
    assert "for tile in range(gl.program_id(0) + 1 * gl.num_programs(0), num_tiles, 2 * gl.num_programs(0)):" in c1
    assert "for tile in range(gl.program_id(0), num_tiles, gl.num_programs(0)):" in prod
    for me, body in ((0, c0), (1, c1)):
        assert_in_order(body, ["g0_n = (tile - gl.program_id(0)) // gl.num_programs(0) * (gl.cdiv(K, 64))",
                               f"mbarrier.wait(turn_bar.index({me}), (turn_n & 1){' ^ 1' if me == 0 else ''})",
                               "for k in range(0, gl.cdiv(K, 64)):", "mbarrier.wait(g0_ready.index(g0_s)",
                               f"mbarrier.arrive(turn_bar.index({1 - me}))",
                               "warpgroup_mma_wait(num_outstanding=0", "tma.async_copy_shared_to_global"])
    assert "seek" not in prod.replace("# ", "") and "turn_bar.index" not in prod
    # one empty arrival per fill (the tile's consumer), turn barriers of one arrival each
    kernel = src[src.index("def gemm_"):]
    assert "mbarrier.init(g0_empty.index(i), count=1)" in kernel
    assert "mbarrier.init(turn_bar.index(i), count=1)" in kernel


@pytest.mark.parametrize("config", PP)
@pytest.mark.parametrize("variant", [{}, {"bias": True, "trans_b": True}])
def test_compiles_for_sm90a_without_spills(config, variant):
    program = pipeline.run(build(GemmRequest(4096, 4096, 4096, **variant), CONFIGS[config]))
    kernel, s = compile_ws_cubin(program)
    assert [(p["name"], p["warps"], p["regs"]) for p in s["partitions"]] == [
        ("consumer0", 4, 232), ("consumer1", 4, 232), ("producer", 1, 40)]
    rows = CONFIGS[config].block_m // 64  # m64 row blocks one warpgroup issues per K sub-step
    assert s["wgmma"] == 2 * rows * (CONFIGS[config].block_k // 16)  # two consumers
