"""Probe (not a test; run by hand, offline, no GPU): where the attention backward's d=128 reduce candidate spills, and
which source change removes it. passes/BACKWARD.md §4 step 8, "Probed: where the BM 32 +
``dQ_swapAB`` form spills", has the numbers and the recommended IR change.

The candidate is ``probe_dq_split.swapab_source``: the separate form's ``bwd_32x128_dp2`` main kernel with FA3's split
dQ^T written in by hand (96 spill bytes, bf16 = fp16, causal or not). Each variant below is one text edit of that
Gluon, compiled for sm_90a (``ptxas -v``, as ``compile.summary`` counts spills), so a template or pass change can be
judged before it is built:

* ``epi_rowptr``: the dK/dV epilogue (``store_ptr``) addresses a row through one 64-bit pointer that already holds
  the column base, plus the tile's i32 column ``arange``: ``p = (ptr + (row + r).to(i64) * ld + col)[:, None] +
  c[None, :]``. Today's form adds ``col + c`` in i32 and sign-extends per element, so ptxas builds a 64-bit address
  per element (two registers each, ``IMAD.WIDE``) and hoists dV's 64 of them while dK is stored; that is where the
  96 bytes are (consumer0's epilogue, not the loop). With the row pointer every element is ``[Rrow + imm]``.
* ``iv``: the step's q head and Q block (``j // T``, ``j % T``) named once at the top of the loop and reused.
* ``carry``: the same two carried as loop counters (no division in the loop): ``qb += 1``, on wrap ``qb = lo``,
  ``qh += 1``.
* ``phase_j``: the ring counter ``g0_n`` and the dS exchange counter ``sync_n`` replaced by the loop variable (both
  equal ``j``: one step, one slot, one meeting).
* ``late_ld``: the lse2/delta loads issued after the S^T and dP^T wgmmas instead of at the top of the step, so their
  offsets and values are live for less of the step.
* ``p32``: producer 32 registers (the budget 2 * 128 * 240 + 128 * 32 = 65536 is the register file: consumers cannot
  have more than 240 with three warpgroups).
* ``cN`` (e.g. ``c216``): consumer1 (the worker consumer) at N registers instead of 240, to measure the headroom (the
  default partition, consumer0, takes what the others leave, at most 248).

Usage, from the repository root: ``python test/codegen/probe_bwd_spills.py [VARIANT[+VARIANT...] ...]`` (default:
today's form and ``epi_rowptr``, each causal or not, bf16 and fp16); a result with spills lists the partition and
generated source line of each ``STL``/``LDL`` (``ptxas -lineinfo``, ``nvdisasm -g``). ``--keep DIR`` writes each
source and PTX to DIR; ``--scan`` prints, per variant and causality (bf16), the fewest registers (steps of 8 from 232)
consumer1 needs for 0 spill bytes.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)

from probe_dq_split import compile_probe, swapab_source  # noqa: E402

_EPI = re.compile(r"^( *)(v_\w+)_p = (\w+)_ptr \+ \(\((.*) \+ \2_r\)\.to\(gl\.int64\) \* \((.*)\)\)\[:, None\] \+ "
                  r"\((.*) \+ \2_c\)\[None, :\]$", re.M)
_LOOP = re.compile(r"^    for j in range\(0, G \* \((gl\.cdiv\(Sq, 32\) - (.*))\)\):\n((?:        .*\n|\n)*)", re.M)


def epi_rowptr(src: str) -> str:
    """store_ptr through a 64-bit row pointer holding the column base, plus the i32 column arange."""
    return _EPI.sub(lambda m: f"{m[1]}{m[2]}_rp = {m[3]}_ptr + (({m[4]} + {m[2]}_r).to(gl.int64) * ({m[5]}) + "
                    f"({m[6]}))\n{m[1]}{m[2]}_p = {m[2]}_rp[:, None] + {m[2]}_c[None, :]", src)


def _each_loop(src: str, edit) -> str:
    """Apply ``edit(header, body, nq, lo) -> (before, header, body)`` to every ``for j`` loop (consumers, producer)."""
    out, at = [], 0
    for m in _LOOP.finditer(src):
        header = m.group(0)[:len(m.group(0)) - len(m[3])]
        before, header, body = edit(header, m[3], m[1], m[2])
        out += [src[at:m.start()], before, header, body]
        at = m.end()
    return "".join(out) + src[at:]


def _names(body: str, nq: str, lo: str) -> str:
    return body.replace(f"(pid_bh % Hkv * G + j // ({nq}))", "qh").replace(f"({lo} + j % ({nq}))", "qb")


def iv(src: str) -> str:
    """Name the step's q head (within the batch) and Q block once at the top of the loop."""
    return _each_loop(src, lambda h, b, nq, lo: (
        "", h, f"        qh = pid_bh % Hkv * G + j // ({nq})\n        qb = {lo} + j % ({nq})\n" + _names(b, nq, lo)))


def carry(src: str) -> str:
    """Carry the q head and Q block as counters: no division or remainder in the loop."""
    def edit(h, b, nq, lo):
        body = _names(b, nq, lo).rstrip("\n") + "\n"
        tail = ("        qb += 1\n        if qb == gl.cdiv(Sq, 32):\n"
                f"            qb = {lo}\n            qh += 1\n")
        return f"    qh = pid_bh % Hkv * G\n    qb = {lo}\n", h, body + tail
    return _each_loop(src, edit)


def phase_j(src: str) -> str:
    """Use the loop variable for the Q/dO ring's slot and phase and for the dS exchange's slot and parity."""
    def edit(h, b, nq, lo):
        b = re.sub(r"\bg0_n\b", "j", re.sub(r"\bsync_n\b", "j", b))
        return "", h, "\n".join(ln for ln in b.split("\n") if ln.strip() != "j += 1")
    return _each_loop(src, edit)


def late_ld(src: str) -> str:
    """Issue the lse2/delta loads after the S^T and dP^T wgmmas (before the first wait)."""
    def edit(h, b, nq, lo):
        lines = b.split("\n")
        loads = [ln for ln in lines if re.match(r" +v_(lv|dl)_c\d(_offs)? = ", ln)]
        if not loads:  # the producer
            return "", h, b
        rest = [ln for ln in lines if ln not in loads]
        i = next(k for k, ln in enumerate(rest) if re.match(r" +v_dpt_c\d = warpgroup_mma\(", ln))
        return "", h, "\n".join(rest[:i + 1] + loads + rest[i + 1:])
    return _each_loop(src, edit)


def _regs(consumer: int, producer: int):
    return lambda src: src.replace("[4, 1], [240, 24])", f"[4, 1], [{consumer}, {producer}])")


VARIANTS = {"base": lambda s: s, "epi_rowptr": epi_rowptr, "iv": iv, "carry": carry, "phase_j": phase_j,
            "late_ld": late_ld, "p32": _regs(240, 32)}


def variant(name: str):
    """The source edit called ``name`` (a key of ``VARIANTS``, or ``cN``: consumer1 at N registers)."""
    if re.fullmatch(r"c\d+", name):
        return _regs(int(name[1:]), 24)
    return VARIANTS[name]


def sass_spills(ptx: str) -> list[str]:
    """``"<line>: <instruction>"``, the generated source line of every STL/LDL (ptxas -lineinfo, nvdisasm -g)."""
    import tempfile

    from triton.backends.nvidia.compiler import get_ptxas

    ptxas = get_ptxas(90).path
    with tempfile.TemporaryDirectory() as d:
        p, cubin = os.path.join(d, "k.ptx"), os.path.join(d, "k.cubin")
        with open(p, "w") as f:
            f.write(ptx)
        subprocess.run([ptxas, "-lineinfo", "--gpu-name=sm_90a", p, "-o", cubin], check=True)
        sass = subprocess.run([os.path.join(os.path.dirname(ptxas), "nvdisasm"), "-c", "-g", cubin],
                              capture_output=True, text=True, check=True).stdout
    where, out = "?", []
    for ln in sass.split("\n"):
        m = re.search(r'//## File "(.*)", line (\d+)', ln)
        if m and "site-packages" not in m[1]:  # a line of the generated source, not of triton's inlined ones
            where = m[2]
        elif re.search(r"\b(STL|LDL)\b", ln):
            out.append(f"{where}: {ln.split(';')[0].split('*/')[-1].strip()}")
    return out


def run(names: str, causal: bool, dtype: str, keep: str | None = None) -> dict:
    """Compile the candidate with the ``+``-joined edits ``names``: ``compile_probe``'s dict, plus ``at`` (partition,
    line and text of each spill) when it spills."""
    src, sig = swapab_source(causal, dtype)
    for name in names.split("+"):
        src = variant(name)(src)
    r = compile_probe(src, sig, with_ptx=True)
    ptx = r.pop("ptx")
    if r["spills"]:  # the partition and source line of each spill (the line numbers are the generated source's)
        lines = src.split("\n")
        where = {}
        for s in sass_spills(ptx):
            n = int(s.split(":")[0]) if s[0].isdigit() else 0
            fn = next((ln.split("(")[0][4:] for ln in reversed(lines[:n]) if ln.startswith("def ")), "?")
            key = f"{fn}:{n} {lines[n - 1].strip()[:48] if n else ''}"
            where[key] = where.get(key, 0) + 1
        r["at"] = where
    if keep:
        tag = f"{names}_{'causal' if causal else 'noncausal'}_{dtype}"
        for ext, text in (("py", src), ("ptx", ptx)):
            with open(os.path.join(keep, f"{tag}.{ext}"), "w") as f:
                f.write(text)
    return r


if __name__ == "__main__":
    args = sys.argv[1:]
    keep = None
    if "--keep" in args:
        i = args.index("--keep")
        keep = args[i + 1]
        os.makedirs(keep, exist_ok=True)
        del args[i:i + 2]
    scan = "--scan" in args  # per variant and causality (bf16): the fewest consumer1 registers with 0 spills
    args = [a for a in args if a != "--scan"]
    for names in args or ["base", "epi_rowptr"]:
        for causal in (False, True):
            if scan:
                fits = None
                for regs in range(232, 183, -8):
                    if run(f"{names}+c{regs}", causal, "bf16")["spills"]:
                        break
                    fits = regs
                print(names, "causal" if causal else "non-causal", "consumer1 fits in", fits, flush=True)
                continue
            for dtype in ("bf16", "fp16"):
                r = run(names, causal, dtype, keep)
                print(names, dtype, "causal" if causal else "non-causal", r, flush=True)
