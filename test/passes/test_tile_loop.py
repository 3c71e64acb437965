"""passes/tile_loop: the walk over the output tiles as one op per partition body, which codegen emits and the
partitioned interpreter runs (the Gluon stays the text codegen printed when it walked the grid itself)."""
from __future__ import annotations

from dataclasses import replace

import pytest
from programs import small_gemm

from torch_autows.codegen.gluon import generate
from torch_autows.interp import make_instance, run_partitioned
from torch_autows.ir import Grid, format_program, parse_program
from torch_autows.passes import PassError, pipeline, tile_loop
from torch_autows.verify import VerifyError, check


def _stages(**kw) -> dict:
    trace: list = []
    pipeline.run(small_gemm(**kw), trace=trace)
    return dict(trace)


def test_every_body_is_one_tile_loop_over_the_program_grid():
    stages = _stages()
    before, after = stages["ping_pong"], stages["tile_loop"]
    for pt, old in zip(after.partitions, before.partitions):
        (tl,) = pt.body
        assert tl.kind == "tile_loop" and Grid.of(tl) == after.grid
        assert tl.body == old.body  # the body itself is unchanged
    assert parse_program(format_program(after)) == after  # the grid's attributes print and parse back
    with pytest.raises(PassError, match="run the pass once"):
        tile_loop.run(after)


def test_verifier_wants_exactly_one_tile_loop_with_the_program_grid():
    stages = _stages()
    with pytest.raises(VerifyError, match="exactly one tile_loop"):
        check(stages["ping_pong"], "tile_loop")
    after = stages["tile_loop"]
    pt = after.partitions[0]
    (tl,) = pt.body
    other = replace(after.grid, serpentine=not after.grid.serpentine)
    bad = replace(after, partitions=(replace(pt, body=(tl.with_attrs(**other.attrs()),)), *after.partitions[1:]))
    with pytest.raises(VerifyError, match="tile_loop walks grid"):
        check(bad, "tile_loop")


def test_codegen_emits_the_walk_from_the_op():
    after = _stages()["tile_loop"]
    src = generate(after)
    assert src.count("for tile in range(gl.program_id(0), num_tiles, gl.num_programs(0)):") == len(after.partitions)
    assert "# tile_loop(" not in src  # the walk's lines are not commented as an op
    with pytest.raises(ValueError, match="not one tile_loop"):
        generate(_stages()["ping_pong"])
    flat = replace(after, partitions=tuple(replace(pt, body=(pt.body[0].with_attrs(persistent=False),))
                                           for pt in after.partitions))
    src = generate(flat)  # the op's attributes, not Program.grid, say how the CTA walks
    assert "for tile in range(" not in src and src.count("tile = gl.program_id(0)") == len(after.partitions)


def test_interpreter_walks_the_tiles_the_op_says():
    after = _stages()["tile_loop"]
    inst = make_instance(after, 0)
    out = run_partitioned(after, inst.inputs(), policy="round_robin")
    assert inst.matches(out), inst.error(out)
    stats: dict = {}
    flat = replace(after, partitions=tuple(replace(pt, body=(pt.body[0].with_attrs(persistent=False),))
                                           for pt in after.partitions))
    out = run_partitioned(flat, inst.inputs(), policy="round_robin", nprog=2, stats=stats)
    assert inst.matches(out), inst.error(out)
    assert stats["ctas"] > 2  # one CTA per tile, as the op says (the program's grid is persistent)
