from __future__ import annotations

import itertools

import pytest

from torch_autows.ir import ARCHS, SM90, TileType, check_expr, eval_expr, format_program, parse_program
from torch_autows.passes import pipeline
from torch_autows.runtime.gemm import CONFIGS
from torch_autows.templates.gemm import GemmRequest, build


@pytest.mark.parametrize("config,variant", [(c, v) for c, v in itertools.product(CONFIGS, range(4))
                                            if v != 3 or CONFIGS[c].split_k == 1])  # bmm never splits K
def test_print_parse_round_trip_after_every_pass(config, variant):
    ta, tb, bias, batch = [(0, 0, 0, 1), (1, 0, 1, 1), (0, 1, 0, 1), (0, 0, 0, 4)][variant]
    trace = []
    pipeline.run(build(GemmRequest(512, 512, 512, trans_a=bool(ta), trans_b=bool(tb), bias=bool(bias), batch=batch),
                       CONFIGS[config]), trace=trace)
    assert len(trace) == 7
    for name, p in trace:
        text = format_program(p)
        assert parse_program(text) == p, name
        assert format_program(parse_program(text)) == text


def test_arch_line_round_trips():
    """The target generation prints as one line after the program's name and parses back exactly; text
    without it (hand-written pass inputs) targets sm90."""
    from dataclasses import replace

    p = build(GemmRequest(512, 512, 512), CONFIGS["ws_p_128x256"])
    text = format_program(p)
    assert text.splitlines()[1] == ("  arch sm90 sm=90 smem_limit=232448 regs_per_sm=65536 max_regs_per_thread=256 "
                                    "min_regs_per_thread=24 reg_granularity=8 mma=wgmma mma_rows=64")
    options = next(ln for ln in text.splitlines() if ln.startswith("  options "))
    assert ARCHS["sm90"] is SM90 and p.arch is SM90 and "smem_limit" not in options and "regs_per_sm" not in options
    other = replace(p, arch=replace(SM90, name="sm90_small", smem_limit=100000))
    assert parse_program(format_program(other)) == other
    without = "\n".join(ln for ln in text.splitlines() if not ln.startswith("  arch "))
    assert parse_program(without) == p


def test_tile_type_text():
    t = TileType.parse("bf16[64,128]@smem")
    assert (t.dtype, t.shape, t.space, t.nbytes) == ("bf16", (64, 128), "smem", 64 * 128 * 2)
    assert str(t) == "bf16[64,128]@smem"
    with pytest.raises(ValueError):
        TileType.parse("bf16(64)")


def test_expressions():
    assert check_expr("pid_m*128+cdiv(K,64)") == {"pid_m", "K"}
    assert eval_expr("cdiv(K,64)", {"K": 65}) == 2
    with pytest.raises(ValueError):
        check_expr("__import__('os')")
    with pytest.raises(ValueError):
        check_expr("a.b")


def test_parse_rejects_garbage():
    with pytest.raises(ValueError):
        parse_program("program x\n  frobnicate\n")


def test_gemm_request_validation():
    with pytest.raises(ValueError, match="bf16 or fp16"):
        GemmRequest(1, 1, 1, dtype="f32")
    with pytest.raises(ValueError, match="m must be >= 1"):
        GemmRequest(0, 1, 1)
