"""IR invariants per pipeline stage. ``check(program, stage)`` raises ``VerifyError`` naming the op.

Stages are ``passes.pipeline.STAGES`` ("template" and the name of each pass in PIPELINE); each stage's
checks include those of the stages before it. At every stage: values are SSA and op kinds are in the op table
(``ssa``). From the template on: accumulating outputs add f32 into an f32 out arg nothing else touches
(``dataflow._check_accumulate``), an ``smem_read`` reads SMEM into registers of its shape
(``dataflow._check_smem_reads``) and no ``chain_sync`` (``sync._check_meetings``: from data_partition on, its chains
balance); from data_partition on: chains are independent and split-K sums what it should
(``dataflow``); from loop_schedule on: loop stages respect latencies (``schedule._check_schedule``); from
partition_schedule, buffers and memory_plan on: partitions, channels and SMEM fit (``resources``). From
code_partition on: rings balance (``sync._check_code``), ping-pong turns are consistent (``sync._check_turns``:
none before ping_pong makes Program.turns, but the tile consumers' main-loop turns, which code_partition makes) and
no wait reads an accumulator a wgmma in flight writes (``sync._check_waits``: ptxas would serialize every wgmma)
and stores staged in a ring's bytes meet, drain and gate its fills (``sync._check_drains``);
from software_pipeline on: a partition loop whose ops span two stages runs its late ops one step behind
(``schedule._check_pipelined``); from tile_loop on: every partition body is one ``tile_loop`` walking
``Program.grid`` (``tiles._check_tile_loops``); from cross_tile on: a ``cross_tile`` walk's carried values are
defined on both paths (the first tile's head and the next tile's step) and nothing else crosses between tiles
(``tiles._check_cross_tile``).

It stays beside ``passes/`` rather than in ``ir/``: its checks are selected by the pipeline's stage names and
read pass analyses (``passes.buffers.value_partition``), a layer above the IR.
"""
from __future__ import annotations

from ..ir import Program
from ..passes.pipeline import STAGES
from .base import VerifyError
from .dataflow import _check_accumulate, _check_chains, _check_smem_reads, _check_split
from .resources import _check_channels, _check_memory, _check_partitions
from .schedule import _check_pipelined, _check_schedule
from .ssa import _check_ssa
from .sync import _check_code, _check_drains, _check_meetings, _check_turns, _check_waits
from .tiles import _check_cross_tile, _check_tile_loops

__all__ = ["VerifyError", "check"]


def check(program: Program, stage: str = STAGES[-1]) -> None:
    """The invariants that hold after ``stage`` (default: the pipeline's last), or ``VerifyError``."""
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; the stages are {', '.join(STAGES)}")
    level = STAGES.index(stage)
    _check_ssa(program, stage)
    for first, checks in _FROM_STAGE:
        if level >= STAGES.index(first):
            for c in checks:
                c(program, stage)


#: The checks that hold from a stage on (after ``_check_ssa``, which holds at every stage), in pipeline order.
_FROM_STAGE = (("template", (_check_accumulate, _check_meetings, _check_smem_reads)),
               ("data_partition", (_check_chains, _check_split)),
               ("loop_schedule", (_check_schedule,)),
               ("partition_schedule", (_check_partitions,)), ("buffers", (_check_channels,)),
               ("memory_plan", (_check_memory,)),
               ("code_partition", (_check_code, _check_turns, _check_waits, _check_drains)),
               ("software_pipeline", (_check_pipelined,)), ("tile_loop", (_check_tile_loops,)),
               ("cross_tile", (_check_cross_tile,)))
