"""The pass pipeline: one visible list, in order, with why each step runs there.

A kernel is made in steps: the template builds the Program (stage "template"), the passes of
``PIPELINE`` transform it, and codegen (``codegen.gluon.generate``) prints the partitioned result as Gluon.
``STAGES`` names the IR stages in order (the template's and each pass's); the verifier and the CLI read it.

``run(program)`` applies every pass, runs the verifier after each one when ``config.debug`` is set
(tests set it), and writes the IR after every step to ``config.dump_dir`` (TORCH_AUTOWS_DUMP=dir); a dump
directory that cannot be written is warned about once and skipped.
"""
from __future__ import annotations

import logging
import os
import re

from .. import config, diagnostics, diskcache
from ..ir import Program, format_program
from . import (
    buffers,
    code_partition,
    cross_tile,
    data_partition,
    loop_schedule,
    memory_plan,
    partition_schedule,
    ping_pong,
    software_pipeline,
    tile_loop,
)

log = logging.getLogger("torch_autows")

PIPELINE = [
    # Split the output tile along M first: every later decision (schedule, roles, buffers) is per chain.
    ("data_partition", data_partition.run),
    # Schedule loops before roles exist: stages say how far ahead loads must run, which sets ring depths.
    ("loop_schedule", loop_schedule.run),
    # Roles from chains and op kinds: TMA loads to the producer, each chain's math to its consumer.
    ("partition_schedule", partition_schedule.run),
    # With roles known, every SMEM value gets a buffer and every cross-role value a channel.
    ("buffers", buffers.run),
    # Ring depths and offsets need the buffers, the stages and the pending wgmma counts.
    ("memory_plan", memory_plan.run),
    # With all decisions fixed: split into per-role bodies and lower channels to mbarrier rings.
    ("code_partition", code_partition.run),
    # On lowered bodies: the pipelined loop's lagged gets and late releases are made from the ring ops.
    ("software_pipeline", software_pipeline.run),
    # Turns wrap the final runs of mma issues, the pipelined steady step's included.
    ("ping_pong", ping_pong.run),
    # Wraps the final bodies: the walk over the output tiles becomes an op (codegen and the interpreter read it).
    ("tile_loop", tile_loop.run),
    # With the walk as an op: a consumer's tile tail runs under the next tile's first step (Options.cross_tile;
    # without it, or where the body has not software_pipeline's head/tail shape, the program is unchanged).
    ("cross_tile", cross_tile.run),
]

#: The IR's stages, in order: the template's output, then each pass's.
STAGES: tuple[str, ...] = ("template", *(name for name, _ in PIPELINE))


def run(program: Program, options=None, *, verify: bool | None = None, dump_dir: str | None = None,
        trace: list | None = None) -> Program:
    """Run every pass; ``trace`` (a list) receives (step name, Program) after each step."""
    from .. import verify as verifier

    verify = config.debug if verify is None else verify
    dump_dir = dump_dir if dump_dir is not None else config.dump_dir
    if verify:
        verifier.check(program, "template")
    _dump(dump_dir, program, 0, "template")
    if trace is not None:
        trace.append(("template", program))
    for i, (name, fn) in enumerate(PIPELINE, 1):
        program = fn(program, options)
        if verify:
            verifier.check(program, name)
        _dump(dump_dir, program, i, name)
        if trace is not None:
            trace.append((name, program))
    return program


def _dump(dump_dir, program: Program, i: int, name: str) -> None:
    """Write the IR of one step to ``dump_dir``; a directory that cannot be made or written is warned about
    once and the dump skipped (it is a debug aid: it never stops a compile)."""
    if not dump_dir:
        return
    try:
        os.makedirs(dump_dir, exist_ok=True)
    except OSError as e:
        diagnostics.faults.log_once(("dump", dump_dir), "torch_autows: cannot dump the IR to %r (TORCH_AUTOWS_DUMP): "
                                    "%s; going on without the dump. Point TORCH_AUTOWS_DUMP at a writable directory, "
                                    "or unset it.", dump_dir, e)
        return
    safe = re.sub(r"[^\w.-]", "_", program.name)
    diskcache.atomic_write(os.path.join(dump_dir, f"{safe}.{i:02d}.{name}.ir"), format_program(program))
