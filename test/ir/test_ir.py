from __future__ import annotations

import itertools

import pytest

from torch_autows.ir import ARCHS, SM90, TileType, TurnGroup, check_expr, eval_expr, format_program, parse_program
from torch_autows.passes import pipeline
from torch_autows.runtime.attention import CONFIGS as ATTENTION_CONFIGS
from torch_autows.runtime.gemm import CONFIGS
from torch_autows.templates.gemm import GemmRequest, build


@pytest.mark.parametrize("config,variant", [(c, v) for c, v in itertools.product(CONFIGS, range(4))
                                            if (v != 3 or CONFIGS[c].split_k == 1)  # bmm never splits K
                                            and (v == 2 or not CONFIGS[c].swap_ab)])  # swap-AB: nn.Linear's nt only
def test_print_parse_round_trip_after_every_pass(config, variant):
    ta, tb, bias, batch = [(0, 0, 0, 1), (1, 0, 1, 1), (0, 1, 0, 1), (0, 0, 0, 4)][variant]
    trace = []
    pipeline.run(build(GemmRequest(512, 512, 512, trans_a=bool(ta), trans_b=bool(tb), bias=bool(bias), batch=batch),
                       CONFIGS[config]), trace=trace)
    assert [name for name, _ in trace] == list(pipeline.STAGES)
    for name, p in trace:
        text = format_program(p)
        assert parse_program(text) == p, name
        assert format_program(parse_program(text)) == text


@pytest.mark.parametrize("config", sorted(ATTENTION_CONFIGS))
def test_attention_round_trips_after_every_pass(config):
    """Attention too, with its pipelined loops and, where the config asks, the ping-pong turns record."""
    from torch_autows.runtime.attention import options_for, serves
    from torch_autows.templates.attention import AttentionRequest
    from torch_autows.templates.attention import build as build_attention

    trace = []
    d = 128 if serves(config, 128) else 64
    pipeline.run(build_attention(AttentionRequest(d, "bf16", True), options_for(config, 0.125)), trace=trace)
    assert [name for name, _ in trace] == list(pipeline.STAGES)
    for name, p in trace:
        text = format_program(p)
        assert parse_program(text) == p, name
        assert format_program(parse_program(text)) == text
    assert (trace[-1][1].turns is not None) == ATTENTION_CONFIGS[config].pingpong


def test_turns_line():
    """Program.turns prints as one line (its barriers' bytes derived from the partitions) and a wrong byte
    count in hand-written text is refused."""
    from dataclasses import replace

    p = replace(build(GemmRequest(512, 512, 512), CONFIGS["ws_p_128x256"]),
                turns=TurnGroup("turn_bar", ("consumer0", "consumer1")))
    text = format_program(p)
    assert "  turns turn_bar: partitions=consumer0,consumer1 bytes=16\n" in text
    assert parse_program(text) == p
    with pytest.raises(ValueError, match="take 16 bytes"):
        parse_program(text.replace("bytes=16", "bytes=8"))


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
