"""Programmatic dependent launch (``Options.pdl``, ``config.pdl``) on a chain of generated decode GEMMs: two Llama-3-8B
layers' q, k, v, o, gate, up and down projections (14 GEMMs, each our heuristic's config, reading the previous
output) captured in one CUDA graph, at M = 1 and 8, median of 7 interleaved rounds of 20 replays. Variants of where
each partition lets the next kernel launch (``griddepcontrol.launch_dependents``): "off" (no PDL), "start" (right
after its ``griddepcontrol.wait``, as ``Options.pdl`` emitted it), "end" (after its tile loop), "wait" (the wait only:
the next kernel launches when this one completes). Every variant's outputs must be bitwise equal to "off".

Needs the tree of the commit that added ``Options.pdl`` (it was reverted after this measurement).

    PYTHONPATH=. python bench/results/sweeps/pdl_chain.py <out.json>
"""
import json
import statistics
import sys

import torch

from torch_autows import config
from torch_autows.runtime import gemm as rtg

BF = torch.bfloat16
dev = "cuda"
res = {}


def timed(fn, iters=20):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(iters):
        fn()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) / iters * 1e3  # us


def interleaved(fns: dict, rounds=7, iters=20):
    for f in fns.values():
        f()
    torch.cuda.synchronize()
    t = {k: [] for k in fns}
    for _ in range(rounds):
        for k, f in fns.items():
            t[k].append(timed(f, iters))
    return {k: statistics.median(v) for k, v in t.items()}



import torch_autows.codegen.compile as cc  # noqa: E402
from torch_autows.codegen import gluon as cg  # noqa: E402
from torch_autows.codegen import sm90  # noqa: E402
from torch_autows.runtime import launch, swiglu  # noqa: E402

WAIT, LAUNCH = sm90.GRID_DEPENDENCY
_gen = cg.generate


def gen_end(program):
    """launch_dependents after each partition's tile loop instead of at its start."""
    src = _gen(program)
    if not program.options.pdl:
        return src
    names = {p.name for p in program.partitions}
    out, cur = [], None

    def close():
        if cur in names:
            last = max(i for i, x in enumerate(out) if x.startswith("    "))
            out.insert(last + 1, LAUNCH)

    for line in src.split("\n"):
        if line.startswith("@gluon.jit") or line.startswith("kernel = "):
            close()
            cur = None
        if line.startswith("def "):
            cur = line[4:line.index("(")]
        if line != LAUNCH:
            out.append(line)
    return "\n".join(out)


def gen_wait_only(program):
    return "\n".join(x for x in _gen(program).split("\n") if x != LAUNCH)


VARIANTS = {"start": _gen, "end": gen_end, "wait": gen_wait_only}


def use(variant):
    cc.generate = VARIANTS.get(variant, _gen)
    launch._compile_kernel.cache_clear()
    for c in (rtg._BOUND, swiglu._BOUND):
        c.clear()
    config.pdl = variant != "off"

# ---- A: a decode layer's GEMMs (forced ours, heuristic config) as a chain in one CUDA graph
def layer_weights(seed):
    g = torch.Generator(device=dev).manual_seed(seed)
    shapes = {"q": (4096, 4096), "k": (1024, 4096), "v": (1024, 4096), "o": (4096, 4096), "g": (14336, 4096),
              "u": (14336, 4096), "d": (4096, 14336)}
    return {n: torch.randn(*s, device=dev, dtype=BF, generator=g) / s[1] ** 0.5 for n, s in shapes.items()}


def layer(x, w, cfg):
    q = rtg.gemm(x, w["q"].t(), None, BF, config=cfg)
    rtg.gemm(x, w["k"].t(), None, BF, config=cfg)
    rtg.gemm(x, w["v"].t(), None, BF, config=cfg)
    o = rtg.gemm(q, w["o"].t(), None, BF, config=cfg)
    g = rtg.gemm(o, w["g"].t(), None, BF, config=cfg)
    rtg.gemm(o, w["u"].t(), None, BF, config=cfg)
    return rtg.gemm(g, w["d"].t(), None, BF, config=cfg)


def chain_graph(x, ws, cfg):
    def run():
        h = x
        for w in ws:
            h = layer(h, w, cfg)
        return h
    run()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = run()
    return g, out


ws = [layer_weights(i) for i in range(2)]
for M in (1, 8):
    x = torch.randn(M, 4096, device=dev, dtype=BF)
    graphs = {}
    outs = {}
    for var in ('off', 'start', 'end', 'wait'):
        use(var)
        graphs[var], outs[var] = chain_graph(x, ws, "auto")
    use('off')
    for g in graphs.values():
        g.replay()
    torch.cuda.synchronize()
    same = all(torch.equal(outs["off"], o) for o in outs.values())
    t = interleaved({k: g.replay for k, g in graphs.items()})
    res[f"chain14-m{M}"] = {**t, "bitwise_equal": same}
    print(f"chain of 14 GEMMs M={M}: " + ", ".join(f"{k} {v:.1f} us ({t['off'] / v:.3f}x)" for k, v in t.items())
          + f", equal {same}", flush=True)

json.dump(res, open(sys.argv[1], 'w'), indent=1)
