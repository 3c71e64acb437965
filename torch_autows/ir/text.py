"""The IR's text form: ``format_program``/``format_op`` print deterministically, ``parse_program`` reads
the same text back (tests write pass inputs and expectations as text)."""
from __future__ import annotations

import ast
import re
from dataclasses import replace
from typing import Any

from .core import (
    SM90,
    Arch,
    Arg,
    BarrierGroup,
    Buffer,
    Channel,
    Grid,
    Op,
    Partition,
    Program,
    TileType,
    TurnGroup,
    Value,
)
from .options import Options


def _fmt_attr(v: Any) -> str:
    return repr(v)


def format_op(o: Op, indent: int = 0) -> list[str]:
    pad = "  " * indent
    res = ", ".join(map(str, o.results))
    lhs = f"{res} = " if res else ""
    args = ", ".join(f"%{x}" for x in o.operands)
    text = f"{pad}{lhs}{o.kind}({args})"
    if o.attrs:
        text += " {" + ", ".join(f"{k}={_fmt_attr(v)}" for k, v in o.attrs) + "}"
    ann = [f"{k}={getattr(o, k)}" for k in ("chain", "partition", "stage", "order") if getattr(o, k) is not None]
    if ann:
        text += " [" + " ".join(ann) + "]"
    if not o.body:
        return [text]
    lines = [text + " {"]
    for b in o.body:
        lines += format_op(b, indent + 1)
    return lines + [pad + "}"]


#: Options printed only when set: fields added after the text form was fixed, whose default leaves every
#: Program as it was (so the IR of existing kernels prints, and hashes, the same). Parsing fills the default.
_UNSET = {("split_k", 1), ("cross_tile", False), ("tile_consumers", 1), ("swap_ab", False), ("dq_split", False),
          ("fold_rows", False), ("split_d", False), ("split_d_binary", False),
          ("lead_chains", False), ("carry_index", False),
          ("epilogue_tma", False), ("ctas_per_sm", 1), ("early_reduce_wait", False),
          ("q_regs", False), ("kv_regs", False), ("store_in_ring", False), ("epilogue_chunk", 0),
          ("epilogue_prefetch", False)}


def format_program(p: Program) -> str:
    lines = [f"program {p.name}"]
    lines.append(f"  arch {p.arch.name} " + " ".join(f"{k}={v}" for k, v in p.arch.items() if k != "name"))
    if p.template:
        lines.append(f"  template {p.template}")
    lines += [f"  {a}" for a in p.args]
    lines.append(f"  {p.grid}")
    lines.append("  options " + " ".join(f"{k}={v}" for k, v in p.options.items() if (k, v) not in _UNSET))
    for pt in p.partitions:
        share = f" tiles={pt.tiles[0]}/{pt.tiles[1]}" if pt.tiles is not None else ""  # printed only when set
        lines.append(f"  partition {pt.name} warps={pt.warps} regs={pt.regs}{share}")
    for b in p.buffers:
        lines.append(f"  buffer {b.name}: {b.type} value=%{b.value} count={b.count} offset={b.offset}")
    for c in p.channels:
        lines.append(f"  channel {c.name}: %{c.value} {c.src} -> {','.join(c.dsts)} buffer={c.buffer} group={c.group}")
    for g in p.groups:
        lines.append(f"  barriers {g.name}: count={g.count} arrivals={g.arrivals} bytes={g.nbytes} "
                     f"channels={','.join(g.channels)}")
    if p.turns is not None:
        scope = f" scope={p.turns.scope}" if p.turns.scope != "mma" else ""  # printed only when not the default
        lines.append(f"  turns {p.turns.name}: partitions={','.join(p.turns.partitions)} bytes={p.turns.nbytes}{scope}")
    if p.smem_bytes is not None:
        lines.append(f"  smem {p.smem_bytes}")
    for n in p.notes:
        lines.append(f"  note {n!r}")
    lines.append("  body {")
    for o in p.body:
        lines += format_op(o, 2)
    lines.append("  }")
    for pt in p.partitions:
        if pt.body:
            lines.append(f"  code {pt.name} {{")
            for o in pt.body:
                lines += format_op(o, 2)
            lines.append("  }")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------- parser


def _split_top(s: str, sep: str = ",") -> list[str]:
    out, depth, cur, quote = [], 0, [], None
    for ch in s:
        if quote:
            cur.append(ch)
            if ch == quote:
                quote = None
            continue
        if ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == sep and depth == 0:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        out.append("".join(cur).strip())
    return out


_OP_RE = re.compile(r"^(?:(?P<res>.+?) = )?(?P<kind>\w+)\((?P<args>[^)]*)\)(?: \{(?P<attrs>.*?)\})?"
                    r"(?: \[(?P<ann>[^\]]*)\])?(?P<open> \{)?$")


def _parse_op_line(line: str) -> tuple[Op, bool]:
    m = _OP_RE.match(line.strip())
    if not m:
        raise ValueError(f"cannot parse op: {line!r}")
    results = []
    if m.group("res"):
        for r in _split_top(m.group("res")):
            name, ty = r.split(":", 1)
            results.append(Value(name.lstrip("%"), TileType.parse(ty)))
    operands = tuple(x.strip().lstrip("%") for x in m.group("args").split(",") if x.strip())
    attrs = []
    if m.group("attrs"):
        for kv in _split_top(m.group("attrs")):
            k, v = kv.split("=", 1)
            attrs.append((k.strip(), ast.literal_eval(v.strip())))
    ann: dict[str, Any] = {}
    if m.group("ann"):
        for kv in m.group("ann").split():
            k, v = kv.split("=", 1)
            ann[k] = v if k == "partition" else int(v)
    o = Op(m.group("kind"), tuple(results), operands, tuple(sorted(attrs)), (), **ann)
    return o, bool(m.group("open"))


def _parse_block(lines: list[str], i: int) -> tuple[tuple[Op, ...], int]:
    ops = []
    while i < len(lines):
        line = lines[i].strip()
        if line == "}":
            return tuple(ops), i + 1
        o, opens = _parse_op_line(line)
        i += 1
        if opens:
            body, i = _parse_block(lines, i)
            o = replace(o, body=body)
        ops.append(o)
    raise ValueError("unterminated block")


def _kv(text: str) -> dict[str, str]:
    return dict(kv.split("=", 1) for kv in text.split())


def _lit(v: str) -> Any:
    if v == "None":
        return None
    try:
        return ast.literal_eval(v)
    except (ValueError, SyntaxError):
        return v


def parse_program(text: str) -> Program:
    """Inverse of ``format_program``."""
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    name = lines[0].split()[1]
    args, parts, bufs, chans, groups, notes = [], [], [], [], [], []
    grid = options = smem = turns = None
    template = ""
    arch = SM90  # text without an arch line (hand-written pass inputs) targets Hopper
    body: tuple[Op, ...] = ()
    codes: dict[str, tuple[Op, ...]] = {}
    i = 1
    while i < len(lines):
        s = lines[i].strip()
        i += 1
        if s.startswith("template "):
            template = s.split()[1]
        elif s.startswith("arch "):
            _, aname, rest = (s + " ").split(" ", 2)
            arch = Arch(aname, **{k: _lit(v) for k, v in _kv(rest).items()})
        elif s.startswith("arg "):
            m = re.fullmatch(r"arg (\w+): (?:(\w+)<(\w+)>\[([^\]]*)\]( out)?(?: alias (\w+))?|(\w+))", s)
            if m.group(7):
                args.append(Arg(m.group(1), "scalar", m.group(7)))
            else:
                dims = tuple(d.strip() for d in m.group(4).split(",") if d.strip())
                args.append(Arg(m.group(1), m.group(2), m.group(3), dims, bool(m.group(5)), m.group(6) or ""))
        elif s.startswith("grid "):
            m = re.fullmatch(r"grid \((.*)\) persistent=(\w+) group=(\d+)( serpentine)?", s)
            tiles = tuple(tuple(x.strip() for x in t.split(":", 1)) for t in _split_top(m.group(1)))
            grid = Grid(tiles, m.group(2) == "True", int(m.group(3)), m.group(4) is not None)
        elif s.startswith("options "):
            options = Options(**{k: _lit(v) for k, v in _kv(s[len("options "):]).items()})
        elif s.startswith("partition "):
            _, pname, rest = s.split(" ", 2)
            kv = _kv(rest)
            share = tuple(int(x) for x in kv["tiles"].split("/")) if "tiles" in kv else None
            parts.append(Partition(pname, int(kv["warps"]), int(kv["regs"]), tiles=share))
        elif s.startswith("buffer "):
            m = re.fullmatch(r"buffer (\S+): (\S+) value=%(\S+) count=(\S+) offset=(\S+)", s)
            bufs.append(Buffer(m.group(1), TileType.parse(m.group(2)), m.group(3), _lit(m.group(4)),
                               _lit(m.group(5))))
        elif s.startswith("channel "):
            m = re.fullmatch(r"channel (\S+): %(\S+) (\S+) -> (\S+) buffer=(\S+) group=(\S+)", s)
            chans.append(Channel(m.group(1), m.group(2), m.group(3), tuple(m.group(4).split(",")), m.group(5),
                                 _lit(m.group(6))))
        elif s.startswith("barriers "):
            m = re.fullmatch(r"barriers (\S+): count=(\d+) arrivals=(\d+) bytes=(\d+) channels=(\S+)", s)
            groups.append(BarrierGroup(m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4)),
                                       tuple(m.group(5).split(","))))
        elif s.startswith("turns "):
            m = re.fullmatch(r"turns (\S+): partitions=(\S+) bytes=(\d+)(?: scope=(\w+))?", s)
            turns = TurnGroup(m.group(1), tuple(m.group(2).split(",")), m.group(4) or "mma")
            if turns.nbytes != int(m.group(3)):
                raise ValueError(f"turns line {s!r}: {turns.count} turn barriers take {turns.nbytes} bytes")
        elif s.startswith("smem "):
            smem = int(s.split()[1])
        elif s.startswith("note "):
            notes.append(ast.literal_eval(s[len("note "):]))
        elif s == "body {":
            body, i = _parse_block(lines, i)
        elif s.startswith("code ") and s.endswith("{"):
            codes[s.split()[1]], i = _parse_block(lines, i)
        else:
            raise ValueError(f"cannot parse line {s!r}")
    parts = [replace(pt, body=codes.get(pt.name, ())) for pt in parts]
    return Program(name, tuple(args), grid, options or Options(), body, tuple(parts), tuple(bufs), tuple(chans),
                   tuple(groups), smem, tuple(notes), arch, turns, template)
