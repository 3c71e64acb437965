"""The SwiGLU MLP's two training fusions against what torch.compile default runs, at the Llama training shapes,
median of 3 interleaved rounds (L2 flushed by do_bench), every output's error against the fp32 reference. Run with
PYTHONPATH=. on the GPU:

    python bench/results/sweeps/swiglu_train.py OUT.json

* forward (runtime.swiglu, ``saved=``, epilogue "swiglu_save"): one kernel writes G, U and silu(G) * U, against two
  cuBLAS GEMMs writing G and U and one pointwise kernel reading them back (``vendor_swiglu`` with ``saved``);
* backward (runtime.swiglu_bwd): the dh GEMM with both gradients of the product in its epilogue, against a cuBLAS GEMM
  writing dh and one pointwise kernel reading dh, G, U and writing dG, du (``vendor_swiglu_bwd``), with cuBLAS's GEMM
  alone beside them.

What should move at 16384 x 14336 bf16 (each [M, N] tensor 470 MB): forward, the default moves G, U twice and C once
(5 transfers) and we move each once (3), ~0.94 GB less (~0.2 ms at 4.3 TB/s; the pointwise kernel took 0.32 ms a
layer in the H200 train profile, sweeps/2026-12-02-h200-train-kernels.json); backward, the default moves dh twice and
G, U, dG, du once (6) and we move 4, ~0.94 GB less, up to the whole pointwise kernel (0.54 ms) where the epilogue's
traffic hides under the other tiles' main loops. Our tiles are 128x128 where cuBLAS runs wider ones: the GEMM-only
column and the forward's GEMM time tell what that costs back.

On an H100 (sweeps/2026-12-05-h100-swiglu-train.json): forward 1.055x / 1.041x / 1.030x the default's path at the
three shapes; backward 0.961x / 0.997x / 0.862x (ours 3638 us against 3497 at 16384x14336x4096, where cuBLAS's GEMM
alone takes 2716): the 128x128 tile's GEMM and the epilogue each CTA's tensor cores wait through cost more than the
dh round trip saves, so the backward stays with the default's path (its prior keeps the vendor's; only a
measurement faster than it takes the kernel).
"""
import json
import sys

import torch
from triton.testing import do_bench

from torch_autows.runtime import swiglu as rt_fwd
from torch_autows.runtime import swiglu_bwd as rt

SHAPES = [(16384, 14336, 4096), (4096, 14336, 4096), (4096, 28672, 8192)]  # (M tokens, N ffn, K hidden)


def _timed(runs: dict, refs: dict, outs: dict) -> dict:
    """Medians (us) and samples of interleaved rounds of ``runs``, and each side's output errors against ``refs``."""
    for f in runs.values():
        f()
    torch.cuda.synchronize()
    errs = {side: [((o.float() - r).norm() / r.norm()).item() for o, r in zip(o_side, refs)]
            for side, o_side in outs.items()}
    times = {name: [] for name in runs}
    for _ in range(3):
        for name, f in runs.items():
            times[name].append(do_bench(f, warmup=10, rep=50))
    med = {name: sorted(t)[1] * 1e3 for name, t in times.items()}
    return {"us": med, "samples_ms": times, "rel_err": errs, "vendor_over_ours": med["vendor"] / med["ours"]}


def measure_forward(m: int, n: int, k: int) -> dict:
    """The forward at one shape: x [M, K] against nn.Linear weights [N, K] (w.t() views), as the model runs it."""
    gen = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
    wg, wu = (torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=gen).t() / k ** 0.5 for _ in range(2))
    ours = tuple(torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16) for _ in range(3))
    vendor = tuple(torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    runs = {"ours": lambda: rt_fwd.gemm_swiglu(x, wg, wu, torch.bfloat16, config=rt_fwd.SAVE_CONFIG, out=ours[0],
                                               saved=ours[1:]),
            "vendor": lambda: rt_fwd.vendor_swiglu(x, wg, wu, vendor[0], vendor[1:])}
    g, u = x.float() @ wg.float(), x.float() @ wu.float()
    refs = (torch.nn.functional.silu(g) * u, g, u)
    return {"m": m, "n": n, "k": k, **_timed(runs, refs, {"ours": ours, "vendor": vendor})}


def measure(m: int, n: int, k: int) -> dict:
    """The backward at one shape: the three runs' medians (us), their samples and both outputs' errors."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    dy = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
    w = torch.randn(k, n, device="cuda", dtype=torch.bfloat16, generator=gen) / k ** 0.5
    g, u = (torch.randn(m, n, device="cuda", dtype=torch.bfloat16, generator=gen) * 2 for _ in range(2))
    ours_out = tuple(torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16) for _ in range(2))
    vendor_out = tuple(torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    dh = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    runs = {"ours": lambda: rt.gemm_swiglu_bwd(dy, w, g, u, config=rt.PICK, out=ours_out),
            "vendor": lambda: rt.vendor_swiglu_bwd(dy, w, g, u, *vendor_out),
            "cublas_gemm_only": lambda: torch.mm(dy, w, out=dh)}
    dhf = dy.float() @ w.float()
    s = torch.sigmoid(g.float())
    refs = (dhf * u.float() * s * (1 + g.float() * (1 - s)), dhf * g.float() * s)
    return {"m": m, "n": n, "k": k, **_timed(runs, refs, {"ours": ours_out, "vendor": vendor_out})}


def main(out_path: str) -> None:
    rows = []
    for m, n, k in SHAPES:  # (M tokens, N ffn, K hidden): the forward's K is the hidden size, the backward's too
        for part, fn in (("forward", measure_forward), ("backward", measure)):
            row = {"part": part, **fn(m, n, k)}
            rows.append(row)
            med = row["us"]
            extra = f", cuBLAS GEMM alone {med['cublas_gemm_only']:.1f}" if "cublas_gemm_only" in med else ""
            print(f"{part} {m}x{n}x{k}: ours {med['ours']:.1f} us, vendor {med['vendor']:.1f}{extra}, vendor/ours "
                  f"{row['vendor_over_ours']:.3f}, errors {row['rel_err']}", flush=True)
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "configs": {"forward": rt_fwd.SAVE_CONFIG, "backward": rt.PICK}}
    with open(out_path, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "swiglu_train.json")
