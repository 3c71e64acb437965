"""Where the RoPE epilogue's time goes (issue 16): the fused q/k projection measured 0.82x the default's path on an
H100 (2026-12-06: 983 against 804 us at the Llama-3-8B q projection, 8x2048 rows), while the plain GEMM on its
128x128 tile ran 716-827 us: the epilogue costs 5-9 us of each tile's ~25. The residual epilogue has the same
structure (an operand tile by TMA, the store staged in its slot, one store wait before the slot's release) and costs
little on 128x256 tiles. GPU only, not a test. At the q (N=4096) and k (N=1024) projections, nn.Linear's layout,
medians of 3 interleaved do_bench rounds (us), outputs checked after NaN poisoning:

* ``cublas``, ``vendor_rope`` (cuBLAS + Inductor-style pointwise RoPE, what the default runs);
* ``plain_128x128``, ``plain_128x256``: our GEMM alone on each tile;
* ``residual_128x128``, ``residual_128x256``: the residual epilogue (R by TMA) on each tile: the operand-tile
  structure without RoPE's second table and math;
* ``rope_tma``, ``rope_pointer``: the RoPE kernel with the tables by TMA (the runtime's pick) and by pointer loads;
* ``rope_wide``: ``runtime.gemm_rope.WIDE``'s 128x256 tile, RoPE in half-head chunks (built after the run that found
  the gap; its numerics on the GPU are test/gpu/test_rope_gpu.py's wide cases, checked here too).

If ``residual_128x128`` costs as much over ``plain_128x128`` as ``rope_tma`` does, the cost is the operand-tile
epilogue on a short tile (its waits exposed twice as often as on 128x256), and a wider RoPE tile (two heads, the
epilogue in head-wide chunks as the SwiGLU backward's) is the fix; if not, it is RoPE's own part.

Run from the repository root: ``PYTHONPATH=. python bench/results/sweeps/rope_epilogue.py OUT.json``.
"""
from __future__ import annotations

import json
import sys

import torch
from sweep_timing import first_runs, interleaved_us

from torch_autows.ops import torch_gemm_rope
from torch_autows.runtime import gemm as rg
from torch_autows.runtime import gemm_rope as gr

M, K, P, D = 16384, 4096, 2048, 128


def _shape(n: int) -> dict:
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = (torch.randn(n, K, device="cuda", dtype=torch.bfloat16) / K ** .5).t()
    r = torch.randn(M, n, device="cuda", dtype=torch.bfloat16)
    cos, sin = (torch.randn(P, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    outs = {c: torch.full((M, n), float("nan"), device="cuda", dtype=torch.bfloat16)
            for c in ("cublas", "vendor_rope", "plain_128x128", "plain_128x256", "residual_128x128",
                      "residual_128x256", "rope_tma", "rope_pointer", "rope_wide")}
    runs = {"cublas": lambda: torch.mm(a, w, out=outs["cublas"]),
            "vendor_rope": lambda: gr.vendor_rope(a, w, cos, sin, None, outs["vendor_rope"]),
            **{f"plain_{t}": (lambda t=t: rg.gemm(a, w, None, torch.bfloat16, config=f"ws_p_{t}",
                                                   out=outs[f"plain_{t}"])) for t in ("128x128", "128x256")},
            **{f"residual_{t}": (lambda t=t: rg.gemm(a, w, None, torch.bfloat16, config=f"ws_p_{t}", residual=r,
                                                      out=outs[f"residual_{t}"])) for t in ("128x128", "128x256")},
            **{f"rope_{x}": (lambda x=x: gr.gemm_rope(a, w, cos, sin, None, out=outs[f"rope_{x}"],
                                                       tables="auto" if x == "tma" else "pointer"))
               for x in ("tma", "pointer")},
            "rope_wide": lambda: gr.gemm_rope(a, w, cos, sin, None, out=outs["rope_wide"], config="rope_p_128x256")}
    row = {"n": n, "rel_err": {}}
    failed = first_runs(runs)
    if failed:
        row["failed"] = failed
    y = a.float() @ w.float()
    refs = {"cublas": y, "plain_128x128": y, "plain_128x256": y, "residual_128x128": y + r.float(),
            "residual_128x256": y + r.float()}
    rope_ref = torch_gemm_rope(a.float(), w.float(), cos.float(), sin.float()).float()
    for c, o in outs.items():
        ref = refs.get(c, rope_ref)
        row["rel_err"][c] = ((o.float() - ref).norm() / ref.norm()).item()
    del y, refs, rope_ref
    row["us"] = interleaved_us(runs, failed)
    print(row, flush=True)
    return row


def main(path: str) -> None:
    out = {"device": torch.cuda.get_device_name(), "rows": [_shape(n) for n in (4096, 1024)]}
    with open(path, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
