"""The SwiGLU backward's dh GEMM with the product's gradients fused (runtime.swiglu_bwd, ours) against what
torch.compile default runs (a cuBLAS GEMM writing dh, then one pointwise kernel reading dh, G, U and writing dG, du:
``vendor_swiglu_bwd``) at the Llama training shapes, with cuBLAS's GEMM alone beside them (the floor the fusion
is measured against: the pointwise kernel's share is what it can win). Median of 3 interleaved rounds, L2 flushed
by do_bench; both outputs' errors against the fp32 reference. Run with PYTHONPATH=. on the GPU:

    python bench/results/sweeps/swiglu_bwd.py OUT.json

What should move: unfused, the GEMM writes dh and the pointwise kernel reads dh, G, U and writes dG, du (6 [M, N]
transfers, the pointwise kernel ~0.55 ms at 16384 x 14336 bf16); fused, the epilogue reads G, U and writes dG, du (4):
~0.94 GB less, about 0.2 ms of the ~3.3 ms pair at 4.3 TB/s if the epilogue's traffic overlapped nothing, up to the
whole pointwise kernel if it hides under the other tiles' main loops (a 128x128 tile instead of cuBLAS's wider ones
may cost some of it back: the GEMM-only column tells)."""
import json
import sys

import torch
from triton.testing import do_bench

from torch_autows.runtime import swiglu_bwd as rt

SHAPES = [(16384, 14336, 4096), (4096, 14336, 4096), (4096, 28672, 8192)]  # (M tokens, N ffn, K hidden)


def measure(m: int, n: int, k: int) -> dict:
    """One shape: the three runs' medians (us), their samples and both outputs' errors."""
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
    for f in runs.values():
        f()
    torch.cuda.synchronize()
    dhf = dy.float() @ w.float()
    s = torch.sigmoid(g.float())
    refs = (dhf * u.float() * s * (1 + g.float() * (1 - s)), dhf * g.float() * s)
    errs = {side: [((o.float() - r).norm() / r.norm()).item() for o, r in zip(outs, refs)]
            for side, outs in (("ours", ours_out), ("vendor", vendor_out))}
    times = {name: [] for name in runs}
    for _ in range(3):
        for name, f in runs.items():
            times[name].append(do_bench(f, warmup=10, rep=50))
    med = {name: sorted(t)[1] * 1e3 for name, t in times.items()}
    return {"m": m, "n": n, "k": k, "us": med, "samples_ms": times, "rel_err": errs,
            "vendor_over_ours": med["vendor"] / med["ours"]}


def main(out_path: str) -> None:
    rows = []
    for m, n, k in SHAPES:
        row = measure(m, n, k)
        rows.append(row)
        med = row["us"]
        print(f"{m}x{n}x{k}: ours {med['ours']:.1f} us, vendor {med['vendor']:.1f}, cuBLAS GEMM alone "
              f"{med['cublas_gemm_only']:.1f}, vendor/ours {row['vendor_over_ours']:.3f}, errors {row['rel_err']}",
              flush=True)
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "config": rt.PICK}
    with open(out_path, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "swiglu_bwd.json")
