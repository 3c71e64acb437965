"""Fused SwiGLU (ours) against what torch.compile default runs (2 cuBLAS GEMMs + 1 fused pointwise kernel) for the
Llama-3-8B MLP 4096 -> 14336 (nn.Linear weights: transposed views): median of 3 interleaved rounds, L2 flushed;
plus the measured choice's pick. Prints a table (run with PYTHONPATH=. on the H200)."""
import torch
from triton.testing import do_bench

from torch_autows import config
from torch_autows.runtime import swiglu as rt

K, N = 4096, 14336
wg = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K ** 0.5
wu = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K ** 0.5
bg, bu = wg.t(), wu.t()


def ours(a, out):
    return rt.gemm_swiglu(a, bg, bu, torch.bfloat16, config="auto", out=out)


print("M     ours_us  vendor_us  vendor/ours  chosen  config")
for M in (1, 8, 16, 64, 128, 2048, 16384):
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    o1 = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    o2 = torch.empty_like(o1)
    config.choice = "autows"
    ours(a, o1)
    rt.vendor_swiglu(a, bg, bu, o2)
    err = ((o1.float() - o2.float()).norm() / o2.float().norm()).item()
    t_ours, t_vendor = [], []
    for _ in range(3):
        t_ours.append(do_bench(lambda a=a, o1=o1: ours(a, o1), warmup=5, rep=20))
        t_vendor.append(do_bench(lambda a=a, o2=o2: rt.vendor_swiglu(a, bg, bu, o2), warmup=5, rep=20))
    t_ours.sort()
    t_vendor.sort()
    config.choice = "measure"
    d = rt.site_decision(a, bg, bu)
    print(f"{M:<5} {t_ours[1] * 1e3:8.1f} {t_vendor[1] * 1e3:9.1f} {t_vendor[1] / t_ours[1]:11.3f}  "
          f"{'ours' if d.use_ours else 'vendor':6}  {rt.choose_config(M, N, K)}  relerr {err:.1e}", flush=True)
