"""Behaviour pin for refactors: the IR after every pipeline step and the generated Gluon of every runtime config.

For each config in ``runtime.gemm.CONFIGS`` and ``runtime.attention.CONFIGS`` this builds the Programs the runtimes
build (GEMM: both dtypes, out dtype = operand or f32, transposed operands, bias, batched, the RoPE epilogue at head dims
64/128 in nn.Linear's layout where the config serves it, its tables by pointers and, one head a tile, by TMA;
attention: each head dim the config serves, both dtypes, causal or not, positive and non-positive scales), and the
attention backward's main kernel in its "reduce" dQ form for each ``runtime.attention_bwd`` config and head dim serving
it (both dtypes, causal or not; the other backward forms are not pinned here), runs the pipeline, and hashes (sha256)
``format_program`` after every step and ``gluon.generate`` of the result.
The hashes must equal ``test/golden_hashes.json``.

A change that is meant to change the generated code regenerates the file (and says so in its commit):

    python test/test_golden_hashes.py --update

A change to the IR alone (a new pass, so a new stage; a new record in the text) changes IR hashes but must not change
a "gluon" hash: ``--check-gluon`` compares only those with the file (``test_gluon_hashes_match`` does the same), and
``--update`` prints how many it changes before it writes."""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import json
import os
import sys

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden_hashes.json")


def cases():
    """(case name, template build function, request, options) for every Program the runtimes can build."""
    from torch_autows.runtime import attention as rt_attention
    from torch_autows.runtime import gemm as rt_gemm
    from torch_autows.templates.attention import HEAD_DIMS, AttentionRequest
    from torch_autows.templates.attention import build as build_attention
    from torch_autows.templates.gemm import GemmRequest
    from torch_autows.templates.gemm import build as build_gemm

    out = []
    for config, opts in rt_gemm.CONFIGS.items():
        for dt, f32, ta, tb, bias in itertools.product(("bf16", "fp16"), (False, True), (False, True),
                                                       (False, True), (False, True)):
            if not rt_gemm.serves_swap(config, trans_a=ta, trans_b=tb):  # swap-AB: nn.Linear's layout only
                continue
            # as runtime.gemm.gemm: M, N, K are run-time scalars, the request leaves them at 1
            req = GemmRequest(1, 1, 1, dt, "f32" if f32 else dt, ta, tb, bias)
            out.append((f"gemm/{config}/{req}", build_gemm, req, opts))
        bmm = opts.split_k == 1 and rt_gemm.serves_swap(config, trans_a=False, trans_b=False, batched=True)
        for dt, f32, batch in itertools.product(("bf16", "fp16"), (False, True), (2, 8) if bmm else ()):
            # as runtime.gemm.bmm: the batch is compiled into the grid
            req = GemmRequest(1, 1, 1, dt, "f32" if f32 else dt, False, False, False, batch)
            out.append((f"gemm/{config}/{req}", build_gemm, req, opts))
        for d, bias in itertools.product((64, 128), (False, True)):  # the RoPE epilogue, nn.Linear's layout
            if rt_gemm.serves_rope(config, d):
                req = GemmRequest(1, 1, 1, "bf16", None, False, True, bias, rope=d)
                out.append((f"gemm/{config}/{req}", build_gemm, req, opts))
                if opts.block_n == d and opts.split_k == 1 and opts.store_buffers == 1:  # tables by TMA
                    # (runtime.gemm_rope.tables_options)
                    out.append((f"gemm/{config}/{req}/epilogue_tma", build_gemm, req,
                                dataclasses.replace(opts, epilogue_tma=True)))
    for config in rt_attention.CONFIGS:
        for d, dt, causal, scale in itertools.product(HEAD_DIMS, ("bf16", "fp16"), (False, True), (0.125, -0.125)):
            if not rt_attention.serves(config, d, causal=causal):
                continue
            opts = rt_attention.options_for(config, scale)
            for o_tma in (False, True) if rt_attention.o_tma_ok(opts.block_m, d, opts) else (False,):
                req = AttentionRequest(d, dt, causal, o_tma=o_tma)
                key = str(req).replace(", o_tma=False", "").replace(", d_v=0", "")  # the keys from before the fields
                out.append((f"attention/{config}/{key}/scale{'+' if scale > 0 else '-'}", build_attention, req, opts))
    for (d, dv), configs in rt_attention.V_HEAD_DIMS.items():  # a v head dim of its own (MLA prefill)
        for config, dt, causal, scale in itertools.product(configs, ("bf16", "fp16"), (False, True), (0.125, -0.125)):
            opts = rt_attention.options_for(config, scale)
            for o_tma in (False, True):
                req = AttentionRequest(d, dt, causal, o_tma=o_tma, d_v=dv)
                out.append((f"attention/{config}/{req}/scale{'+' if scale > 0 else '-'}", build_attention, req, opts))
    out += _attention_bwd_cases()
    return out


def _attention_bwd_cases():
    """The reduce form of the attention backward's main kernel, as runtime.attention_bwd builds it (dK/dV by pointer
    and, for whole KV tiles, by TMA)."""
    from torch_autows.runtime import attention_bwd as rt_bwd
    from torch_autows.templates.attention_bwd import HEAD_DIMS, AttentionBwdRequest
    from torch_autows.templates.attention_bwd import build as build_bwd

    out = []
    for config, opts in rt_bwd.CONFIGS.items():
        for d, dt, causal in itertools.product(HEAD_DIMS, ("bf16", "fp16"), (False, True)):
            if rt_bwd.serves(config, d, "reduce"):
                req = AttentionBwdRequest(d, dt, causal, dq="reduce")
                tma = rt_bwd.tma_request("attention_bwd", req, opts, True, "kv_tma")  # whole KV tiles
                for r in dict.fromkeys((req, tma)):
                    key = str(r).replace(", kv_tma=False", "")  # the keys from before the field
                    out.append((f"attention_bwd/{config}/{key}", build_bwd, r, opts))
    return out


def hashes(build, req, opts) -> dict[str, str]:
    """sha256 of the IR text after every pipeline step and of the generated Gluon."""
    from torch_autows.codegen import gluon
    from torch_autows.ir import format_program
    from torch_autows.passes import pipeline

    trace: list = []
    program = pipeline.run(build(req, opts), verify=False, dump_dir="", trace=trace)
    h = {name: hashlib.sha256(format_program(p).encode()).hexdigest() for name, p in trace}
    h["gluon"] = hashlib.sha256(gluon.generate(program).encode()).hexdigest()
    return h


def compute() -> dict[str, dict[str, str]]:
    return {name: hashes(build, req, opts) for name, build, req, opts in cases()}


@functools.lru_cache(maxsize=1)
def _computed() -> dict[str, dict[str, str]]:
    """``compute()`` once per test session (two tests compare it)."""
    return compute()


def _golden() -> dict[str, dict[str, str]]:
    with open(GOLDEN) as f:
        return json.load(f)


def gluon_changes(got: dict, want: dict) -> list[str]:
    """Cases whose generated Gluon hash differs between two hash tables (a case on one side only included)."""
    return sorted(n for n in set(got) | set(want) if got.get(n, {}).get("gluon") != want.get(n, {}).get("gluon"))


def test_gluon_hashes_match():
    """The generated Gluon of every case is the committed one, whatever the IR stages are called."""
    changed = gluon_changes(_computed(), _golden())
    assert not changed, (f"the generated Gluon changed for {len(changed)} cases (first: {changed[:10]}); if "
                         "intended, regenerate with `python test/test_golden_hashes.py --update`")


def test_golden_hashes_match():
    want = _golden()
    got = _computed()
    assert sorted(got) == sorted(want), (
        f"the cases changed: new {sorted(set(got) - set(want))}, gone {sorted(set(want) - set(got))}; "
        "regenerate with `python test/test_golden_hashes.py --update` if that is intended")
    diff = [f"{name}: {step}" for name in sorted(got) for step in got[name] if got[name][step] != want[name].get(step)]
    assert not diff, ("generated IR or Gluon changed (first differing step per case listed); if intended, "
                      "regenerate with `python test/test_golden_hashes.py --update`:\n  " + "\n  ".join(diff[:40]))


def test_golden_cases_cover_every_config():
    from torch_autows.runtime import attention as rt_attention
    from torch_autows.runtime import gemm as rt_gemm

    names = [name for name, *_ in cases()]
    for c in rt_gemm.CONFIGS:
        assert any(n.startswith(f"gemm/{c}/") for n in names)
    for c in rt_attention.CONFIGS:
        assert any(n.startswith(f"attention/{c}/") for n in names)


def test_hashes_change_with_the_program():
    """The check can fail: a different option gives different hashes."""
    from dataclasses import replace

    name, build, req, opts = cases()[0]
    assert hashes(build, req, opts) != hashes(build, req, replace(opts, stages=opts.stages - 1))


if __name__ == "__main__":
    if sys.argv[1:] not in (["--update"], ["--check-gluon"]):
        sys.exit("usage: python test/test_golden_hashes.py --update  (rewrites test/golden_hashes.json)\n"
                 "       python test/test_golden_hashes.py --check-gluon  (compares only the Gluon hashes with it)")
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    got = compute()
    changed = gluon_changes(got, _golden())
    print(f"gluon hashes: {len(got)} cases, {len(changed)} differ from {GOLDEN}" + "".join(
        f"\n  {n}" for n in changed))
    if sys.argv[1] == "--check-gluon":
        sys.exit(1 if changed else 0)
    with open(GOLDEN, "w") as f:
        json.dump(got, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"wrote {GOLDEN}")
