"""The tile IR: a Program of Ops over tile values, frozen dataclasses with a deterministic text form.

A ``Program`` is one kernel: its arguments (tensors in memory and scalars), the output-tile grid it
walks (``Grid``; persistent or one tile per CTA), its decision points (``Options``), the GPU generation
it targets (``Arch``: SMEM, register file, MMA kind; ``SM90`` unless built otherwise) and the body of
``Op``s that computes one output tile. Values are SSA names (``%acc``) with a ``TileType``: dtype,
shape and memory space (``reg`` or ``smem``). Index expressions (load coordinates, loop bounds) are
small Python expressions over scalar names (``pid_m*128+64``, ``cdiv(K,64)``), kept as strings.

Analysis results live on the IR so every pass's result prints:
    Op.chain      data-partition chain (None: shared read-only input)          data_partition
    Op.stage      software-pipeline stage inside its loop, Op.order its slot  loop_schedule
    Op.partition  warp-group role that runs it                                partition_schedule
    Program.partitions (warps, regs), Program.buffers, Program.channels       later passes
    Buffer.count / Buffer.offset                                              memory_plan
    Partition.body, Channel.group, Program.groups (barrier pairs)             code_partition
    Program.turns (ping-pong turn barriers)                                   ping_pong
    each Partition.body wrapped in one ``tile_loop`` op (the grid walk)         tile_loop

This module holds the records and their constructors (the decision points, ``Options``, in ``options.py``);
``analysis.py`` walks and queries op bodies and evaluates index expressions, ``text.py`` prints a Program
(``format_program``) and reads the same text back (``parse_program``), and ``kinds.py`` is the op table.
``torch_autows.ir`` re-exports all of them.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field, replace
from typing import Any

from .options import Options

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "f32": 4, "fp32": 4, "i32": 4, "i64": 8, "fp8e4": 1}


@dataclass(frozen=True)
class TileType:
    dtype: str
    shape: tuple[int, ...]
    space: str = "reg"  # "reg" (distributed over threads) or "smem"

    @property
    def nbytes(self) -> int:
        n = DTYPE_BYTES[self.dtype]
        for d in self.shape:
            n *= d
        return n

    def __str__(self) -> str:
        s = f"{self.dtype}[{','.join(map(str, self.shape))}]"
        return s if self.space == "reg" else f"{s}@{self.space}"

    @staticmethod
    def parse(text: str) -> TileType:
        m = re.fullmatch(r"(\w+)\[([\d,]*)\](?:@(\w+))?", text.strip())
        if not m:
            raise ValueError(f"bad tile type {text!r}")
        shape = tuple(int(x) for x in m.group(2).split(",") if x)
        return TileType(m.group(1), shape, m.group(3) or "reg")


@dataclass(frozen=True)
class Value:
    name: str
    type: TileType

    def __str__(self) -> str:
        return f"%{self.name}:{self.type}"


@dataclass(frozen=True)
class Op:
    """One operation. ``body`` is non-empty only for ``loop`` and ``tile_loop``; ``attrs`` is a sorted tuple of
    (key, value)."""

    kind: str
    results: tuple[Value, ...] = ()
    operands: tuple[str, ...] = ()
    attrs: tuple[tuple[str, Any], ...] = ()
    body: tuple[Op, ...] = ()
    chain: int | None = None
    partition: str | None = None
    stage: int | None = None
    order: int | None = None

    def attr(self, key: str, default: Any = None) -> Any:
        for k, v in self.attrs:
            if k == key:
                return v
        return default

    def with_attrs(self, **kw: Any) -> Op:
        d = dict(self.attrs)
        d.update(kw)
        return replace(self, attrs=tuple(sorted(d.items())))

    @property
    def result(self) -> Value:
        assert len(self.results) == 1, self
        return self.results[0]


def op(kind: str, results=(), operands=(), body=(), **attrs: Any) -> Op:
    """Build an Op with attrs given as keywords (sorted, so equal ops compare and print equal)."""
    return Op(kind, tuple(results), tuple(operands), tuple(sorted(attrs.items())), tuple(body))


@dataclass(frozen=True)
class Arg:
    """A kernel argument. Tensors are described as they lie in memory (dims outermost first, row-major
    in the last dim); a transposed view is a ``trans`` op on the loaded tile, not a different Arg."""

    name: str
    kind: str  # "tensor" | "ptr" | "scalar"
    dtype: str
    dims: tuple[str, ...] = ()
    out: bool = False
    # a tensor arg that is the tensor of arg ``alias`` read or written in another TMA block shape (its own
    # descriptor); the runtime and the interpreter pass the aliased arg's tensor
    alias: str = ""

    def __str__(self) -> str:
        if self.kind == "scalar":
            return f"arg {self.name}: {self.dtype}"
        return (f"arg {self.name}: {self.kind}<{self.dtype}>[{', '.join(self.dims)}]" + (" out" if self.out else "")
                + (f" alias {self.alias}" if self.alias else ""))


@dataclass(frozen=True)
class Grid:
    """The output tiles: ``tiles`` are (index name, extent expression), outermost first. Persistent
    kernels walk tiles ``pid, pid + nprog, ...`` in grouped order (``group`` rows of the second-to-last
    index at a time, for L2 reuse); otherwise one tile per CTA in the same order."""

    tiles: tuple[tuple[str, str], ...]
    persistent: bool = True
    group: int = 8
    serpentine: bool = False  # persistent: odd waves of tiles walked in reverse (see Options.serpentine)

    def __str__(self) -> str:
        t = ", ".join(f"{n}: {e}" for n, e in self.tiles)
        tail = " serpentine" if self.serpentine else ""
        return f"grid ({t}) persistent={self.persistent} group={self.group}{tail}"

    def attrs(self) -> dict[str, Any]:
        """The grid as the attributes of a ``tile_loop`` op (passes/tile_loop; ``group`` as ``tile_group``, apart
        from the barrier ``group`` of ring ops); ``Grid.of`` reads them back."""
        return {"tiles": self.tiles, "persistent": self.persistent, "tile_group": self.group,
                "serpentine": self.serpentine}

    @staticmethod
    def of(o: Op) -> Grid:
        """The grid a ``tile_loop`` op walks (its attributes, as ``attrs`` writes them)."""
        if o.kind != "tile_loop":
            raise ValueError(f"Grid.of: a {o.kind} op has no grid; only tile_loop (passes/tile_loop) carries one")
        return Grid(tuple(tuple(t) for t in o.attr("tiles")), o.attr("persistent"), o.attr("tile_group"),
                    o.attr("serpentine"))


@dataclass(frozen=True)
class Arch:
    """The GPU generation a Program targets: the hardware facts the passes, the verifier and codegen read.

    ``name`` picks codegen's lowering module (``codegen.gluon.LOWERINGS``); ``sm`` is the compute capability
    as triton's ``GPUTarget`` takes it. A new generation is a record here (and in ``ARCHS``) plus its
    lowering module beside ``codegen/sm90.py``."""

    name: str
    sm: int
    smem_limit: int  # bytes of shared memory one CTA may allocate
    regs_per_sm: int  # 32-bit registers in an SM's register file, shared by all partitions
    max_regs_per_thread: int  # most registers per thread setmaxnreg gives
    min_regs_per_thread: int  # fewest registers per thread setmaxnreg gives
    reg_granularity: int  # setmaxnreg takes multiples of this
    mma: str  # the MMA instruction family the lowering emits ("wgmma")
    mma_rows: int  # rows of an MMA tile one warpgroup (4 warps) issues

    def items(self) -> list[tuple[str, Any]]:
        return [(f.name, getattr(self, f.name)) for f in dataclasses.fields(self)]

    def smem_per_cta(self, ctas: int = 1) -> int:
        """Bytes of SMEM each of ``ctas`` CTAs resident on one SM may allocate: the SM's (``smem_limit`` plus the
        driver's reserve of one CTA) split evenly, less each CTA's own reserve (sm_90: 228 KB an SM, 1 KB a CTA)."""
        return (self.smem_limit + SMEM_RESERVED_PER_CTA) // ctas - SMEM_RESERVED_PER_CTA

    def cta_threads(self, warps) -> int:
        """Threads of a CTA whose partitions have ``warps`` warps each, every partition padded to whole warpgroups
        (setmaxnreg's unit), as Triton launches a warp-specialized kernel."""
        return 128 * sum(-(-w // 4) for w in warps)

    def regs_per_thread(self, ctas: int, threads: int) -> int:
        """Registers per thread at launch when ``ctas`` CTAs of ``threads`` threads each share the register file
        evenly (Options.ctas_per_sm > 1: the compile's ``maxnreg``; setmaxnreg reallocates within a CTA after)."""
        regs = self.regs_per_sm // ctas // threads // self.reg_granularity * self.reg_granularity
        return min(regs, self.max_regs_per_thread)


#: SMEM the driver reserves for every resident CTA (sm_90).
SMEM_RESERVED_PER_CTA = 1024

#: Hopper (H100/H200): 227 KB of SMEM per CTA, asynchronous wgmma with M=64 per warpgroup.
SM90 = Arch("sm90", sm=90, smem_limit=232448, regs_per_sm=65536, max_regs_per_thread=256, min_regs_per_thread=24,
            reg_granularity=8, mma="wgmma", mma_rows=64)
#: Every generation codegen can lower, by name.
ARCHS = {a.name: a for a in (SM90,)}


@dataclass(frozen=True)
class Partition:
    """A warp-group role. ``tiles`` = (c, t): it runs only the tiles j of its CTA's walk with j % t == c (the
    ping-pong consumers of ``Options.tile_consumers``; passes/partition_schedule); None: every tile."""

    name: str
    warps: int
    regs: int
    body: tuple[Op, ...] = ()
    tiles: tuple[int, int] | None = None


@dataclass(frozen=True)
class Buffer:
    """SMEM for a value: ``count`` copies (ring slots) at byte ``offset`` (equal offsets = reuse)."""

    name: str
    type: TileType
    value: str  # the SSA value it holds
    count: int | None = None
    offset: int | None = None

    @property
    def nbytes(self) -> int:
        return self.type.nbytes * (self.count or 1)


@dataclass(frozen=True)
class Channel:
    """A value crossing partitions, through ``buffer``; ``group`` names its mbarrier ready/empty pair."""

    name: str
    value: str
    src: str
    dsts: tuple[str, ...]
    buffer: str
    group: str | None = None


@dataclass(frozen=True)
class BarrierGroup:
    """One ring of mbarriers: ``ready`` (filled, expect-tx bytes) and ``empty`` (``arrivals`` releases)."""

    name: str
    count: int
    arrivals: int
    nbytes: int
    channels: tuple[str, ...]


@dataclass(frozen=True)
class TurnGroup:
    """Ping-pong turn mbarriers, the other kind of barrier group: one per partition of ``partitions`` (in
    turn order), each completed by one arrival. Partition i waits on barrier i before issuing an mma
    group and arrives on barrier i+1 (mod count) after it (ops ``turn_wait {me=i}`` / ``turn_pass {to}``).

    ``scope`` says what a turn wraps: "mma" (passes/ping_pong: each issue group of mmas, every partition every
    tile) or "mainloop" (passes/code_partition, tile consumers: one turn per tile around the loops that read the
    shared rings, so tile j's consumer waits on its fills only after tile j-1's consumer passed all of its own:
    a fill's slot then holds the lap before it, and a parity wait cannot pass a lap early)."""

    name: str
    partitions: tuple[str, ...]
    scope: str = "mma"

    @property
    def count(self) -> int:
        return len(self.partitions)

    @property
    def nbytes(self) -> int:
        """SMEM of the barriers: 8 B each."""
        return 8 * self.count


@dataclass(frozen=True)
class Program:
    name: str
    args: tuple[Arg, ...]
    grid: Grid
    options: Options
    body: tuple[Op, ...]
    partitions: tuple[Partition, ...] = ()
    buffers: tuple[Buffer, ...] = ()
    channels: tuple[Channel, ...] = ()
    groups: tuple[BarrierGroup, ...] = ()
    smem_bytes: int | None = None
    notes: tuple[str, ...] = field(default=())
    arch: Arch = SM90
    turns: TurnGroup | None = None  # ping-pong turn barriers (passes/ping_pong); None: partitions do not take turns
    template: str = ""  # the template that built it (templates.TEMPLATES); "" for hand-written IR

    def arg(self, name: str) -> Arg:
        for a in self.args:
            if a.name == name:
                return a
        raise KeyError(name)

    def base_arg(self, name: str) -> str:
        """The arg whose tensor arg ``name`` is: its ``alias``, or itself."""
        return self.arg(name).alias or name

    def buffer(self, name: str) -> Buffer:
        return next(b for b in self.buffers if b.name == name)

    def channel(self, name: str) -> Channel:
        return next(c for c in self.channels if c.name == name)

    def partition(self, name: str) -> Partition:
        return next(p for p in self.partitions if p.name == name)
