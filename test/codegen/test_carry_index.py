"""``Options.carry_index`` (codegen/emit_control.carried_counters): a loop's ``j // n`` and ``j % n`` with ``n``
loop-invariant become two counters carried from step to step. The rewrite of the index expressions; the emitted
counters equal the divisions at every step from any lower bound (the generated lines, run in Python); and the
attention backward's reduce picks compiled for sm_90a with it: fewer integer-division sequences, no spills beyond
the picks' own, no serialized or injected wgmma waits. The IR is unchanged (the interpreter's runs of it stand);
what the option is worth on the H200 is not measured yet (bench/results/sweeps/attention_bwd_configs.py ``_cc``)."""
from __future__ import annotations

import collections
import dataclasses
import re

import pytest

from torch_autows.codegen import gluon
from torch_autows.codegen.emit_control import carried_counters
from torch_autows.ir import op
from torch_autows.passes import pipeline
from torch_autows.runtime.attention_bwd import CONFIGS, choose_config
from torch_autows.templates.attention_bwd import AttentionBwdRequest, build


def test_rewrites_divisions_of_the_loop_variable_by_an_invariant():
    inner = op("store", coords=("j//(cdiv(Sq,64)-0)*8", "(j+1)//(cdiv(Sq,64)-0)"), arg="x")
    body = (op("load", coords=("h*Hq+j//(cdiv(Sq,64)-0)", "(0+j%(cdiv(Sq,64)-0))*64"), arg="q", buffer="q_smem"),
            op("mask", col="j%(j+1)", row="pid_n*128", causal=False),
            op("loop", body=(inner,), var="k", lb=0, ub="j%(cdiv(Sq,64)-0)", iter_args=()))
    new, divisors = carried_counters(body, "j")
    assert divisors == {"cdiv(Sq, 64) - 0": 0}
    assert new[0].attr("coords") == ("h * Hq + j_h0", "(0 + j_q0) * 64") and new[0].attr("buffer") == "q_smem"
    assert new[1].attr("col") == "j%(j+1)"  # a divisor that reads j: kept
    assert new[2].attr("ub") == "j_q0"
    # nested bodies too; (j + 1) // n is not j // n: kept as written
    assert new[2].body[0].attr("coords") == ("j_h0 * 8", "(j+1)//(cdiv(Sq,64)-0)")
    assert carried_counters(body, "i") == (body, {})  # another loop's variable: nothing to carry


def _program(config: str, d: int, causal: bool, carry: bool):
    opts = dataclasses.replace(CONFIGS[config], carry_index=carry)
    return pipeline.run(build(AttentionBwdRequest(d, "bf16", causal, dq="reduce"), opts))


@pytest.mark.parametrize("lb,n", [(0, 1), (0, 3), (5, 3), (7, 4), (2, 9)])
def test_emitted_counters_equal_the_divisions_at_every_step(lb, n):
    """The counter lines the d=64 reduce pick's loops carry, run in Python: j_q0 == j % n and j_h0 == j // n at the
    top of every step."""
    src = gluon.generate(_program(choose_config(64, False, "reduce"), 64, False, True))
    lines = src.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.strip().startswith("j_n0 = "))
    init = [ln.strip() for ln in lines[start + 1:start + 3]]
    assert init == ["j_q0 = (0) % j_n0", "j_h0 = (0) // j_n0"]
    end = next(i for i, ln in enumerate(lines) if ln.strip() == "j_q0 += 1" and i > start)
    update = [ln[len(lines[end]) - len(lines[end].lstrip()):] for ln in lines[end:end + 4]]
    env = {"j_n0": n}
    exec("\n".join(s.replace("(0)", f"({lb})") for s in init), {}, env)
    for j in range(lb, lb + 3 * n + 2):
        assert (env["j_q0"], env["j_h0"]) == (j % n, j // n), j
        exec("\n".join(update), {}, env)


@pytest.mark.parametrize("config,d,causal", [(choose_config(64, False, "reduce"), 64, False),
                                             (choose_config(64, True, "reduce"), 64, True),
                                             (choose_config(128, False, "reduce"), 128, False),
                                             (choose_config(128, True, "reduce"), 128, True)])
def test_reduce_picks_compile_with_fewer_divisions(config, d, causal):
    from torch_autows.codegen.compile import compile_offline, sass, summary

    counts = {}
    for carry in (False, True):
        program = _program(config, d, causal, carry)
        src = gluon.generate(program)
        kernel = compile_offline(program)
        s = summary(program, kernel)
        ops = collections.Counter(re.findall(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", sass(kernel)))
        counts[carry] = (ops["I2F.RP"], s["spills"])
        assert not s["wgmma_serialized"] and s["wgmma_waits_injected"] == 0
    assert not re.search(r"\bj (//|%) \(gl\.cdiv", src)  # every per-step division carried
    (div0, spill0), (div1, spill1) = counts[False], counts[True]
    assert div1 < div0 and spill1 <= spill0, counts
