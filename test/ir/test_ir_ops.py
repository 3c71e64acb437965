"""The op table (torch_autows.ir.kinds) is the one list of op kinds: codegen, the interpreter and the templates agree
with it, and the verifier enforces it."""
from __future__ import annotations

import pytest
from test_golden_hashes import cases

from torch_autows.codegen.gluon import LOWERINGS, emitters_for
from torch_autows.interp.ops import SEMANTICS
from torch_autows.interp.partitioned import HANDLERS
from torch_autows.ir import format_program, parse_program, walk
from torch_autows.ir.kinds import OPS, kind_of, kinds
from torch_autows.passes import pipeline
from torch_autows.verify import VerifyError, check


@pytest.mark.parametrize("arch", sorted(LOWERINGS))
def test_every_kind_has_a_gluon_emitter_and_nothing_else_does(arch):
    emitters = emitters_for(arch)
    assert set(OPS) - set(emitters) == set(), \
        f"kinds without a Gluon emitter (codegen/emitters.py or codegen/{arch}.py @emitter)"
    assert set(emitters) - set(OPS) == set(), "emitters for kinds not in the op table (ir/kinds.py)"


def test_every_kind_has_an_interpreter_semantic():
    for name, k in OPS.items():
        if k.structural:  # loop / yield / tile_loop: the interpreters walk them as structure
            continue
        if k.phase == "template":  # the sequential interpreter runs template programs: SEMANTICS alone
            assert name in SEMANTICS, f"{name}: no @semantics in interp/ops.py"
        else:
            assert name in SEMANTICS or name in HANDLERS, f"{name}: no semantics or partitioned handler"
    assert set(SEMANTICS) | set(HANDLERS) <= set(OPS), "interpreter meanings for kinds not in the op table"


def _swiglu_cases():
    """The swiglu GEMMs runtime.swiglu builds (not in the golden hashes' cases)."""
    from torch_autows.runtime.swiglu import CONFIGS
    from torch_autows.templates.gemm import GemmRequest
    from torch_autows.templates.gemm import build as build_gemm

    return [(f"swiglu/{c}", build_gemm, GemmRequest(1, 1, 1, trans_b=True, epilogue="swiglu"), o)
            for c, o in CONFIGS.items()]


def _residual_cases():
    """The residual GEMMs runtime.gemm builds (R by TMA where K is not split; not in the golden hashes' cases)."""
    from torch_autows.runtime.gemm import CONFIGS, residual_options, serves_residual
    from torch_autows.templates.gemm import GemmRequest
    from torch_autows.templates.gemm import build as build_gemm

    return [(f"residual/{c}", build_gemm, GemmRequest(1, 1, 1, bias=True, residual=True), residual_options(c))
            for c in CONFIGS if serves_residual(c)]


def _activation_cases():
    from torch_autows.runtime.gemm import CONFIGS
    from torch_autows.templates.gemm import GemmRequest
    from torch_autows.templates.gemm import build as build_gemm

    return [(f"activation/{c}", build_gemm, GemmRequest(1, 1, 1, bias=True, activation="gelu_tanh"), CONFIGS[c])
            for c in ("ws_p_128x128", "dec_64x128_s2")]


def _swiglu_bwd_cases():
    from torch_autows.runtime.swiglu_bwd import CONFIGS
    from torch_autows.templates.gemm import GemmRequest
    from torch_autows.templates.gemm import build as build_gemm

    return [(f"swiglu_bwd/{c}", build_gemm, GemmRequest(1, 1, 1, epilogue="swiglu_bwd"), o) for c, o in CONFIGS.items()]


def _attention_bwd_cases():
    """The attention backward's main kernel (templates.attention_bwd; no runtime config yet), one and two chains."""
    from torch_autows.ir import Options
    from torch_autows.templates.attention_bwd import AttentionBwdRequest
    from torch_autows.templates.attention_bwd import build as build_bwd

    return [(f"attention_bwd/dp{dp}/{dq}", build_bwd, AttentionBwdRequest(64, "bf16", True, dq=dq),
             Options(block_m=64, block_n=64 * dp, stages=2, data_partition=dp)) for dp in (1, 2)
            for dq in ("atomic", "reduce")] + [
        ("attention_bwd/dq_split", build_bwd, AttentionBwdRequest(128, "bf16", True, dq="reduce"),
         Options(block_m=32, block_n=128, stages=2, data_partition=2, dq_split=True, producer_regs=24))]


def test_every_kind_the_templates_and_passes_make_is_in_the_table():
    used: dict[str, set[str]] = {}
    for _, build, req, opts in (cases() + _swiglu_cases() + _residual_cases() + _activation_cases()
                                + _swiglu_bwd_cases() + _attention_bwd_cases()):
        trace: list = []
        pipeline.run(build(req, opts), verify=False, dump_dir="", trace=trace)
        for stage, p in trace:
            for body in (p.body, *(pt.body for pt in p.partitions)):
                for o in walk(body):
                    used.setdefault(o.kind, set()).add(stage)
                    k = kind_of(o.kind)
                    lo, hi = k.operands
                    assert lo <= len(o.operands) and (hi is None or len(o.operands) <= hi), o
                    lo, hi = k.results
                    assert lo <= len(o.results) and (hi is None or len(o.results) <= hi), o
    assert set(OPS) - set(used) == {"neg", "where"}, "kinds no template or pass makes (besides neg, where)"
    # made by code_partition (turns too: the tile consumers' main-loop turns, ping_pong's mma turns later; tile_loop,
    # tile_next: their own passes), never before
    for name in kinds(phase="partitioned"):
        first = name if name == "tile_loop" else "cross_tile" if name == "tile_next" else "code_partition"
        assert used[name] == set(pipeline.STAGES[pipeline.STAGES.index(first):]), name


def test_unknown_kind_is_named_with_where_to_add_it():
    with pytest.raises(KeyError, match="ir/kinds.py"):
        kind_of("frobnicate")


def _template_text():
    name, build, req, opts = cases()[0]
    return format_program(build(req, opts))


def test_verifier_rejects_a_kind_not_in_the_table():
    p = parse_program(_template_text().replace("= zeros(", "= frobnicate(", 1))
    with pytest.raises(VerifyError, match="unknown op kind 'frobnicate'"):
        check(p, "template")


def test_verifier_checks_the_operand_count():
    text = _template_text()
    assert "cast(%acc_out)" in text
    p = parse_program(text.replace("cast(%acc_out)", "cast(%acc_out, %acc_out)", 1))
    with pytest.raises(VerifyError, match="cast takes 1..1 operands, not 2"):
        check(p, "template")
