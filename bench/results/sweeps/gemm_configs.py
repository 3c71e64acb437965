"""TFLOP/s of every GEMM config on the short-K and bias shapes, against cuBLAS, same process."""
import json, os, torch, triton
from torch_autows.runtime import gemm as rt
rows = []
def tf(fl, f):
    return fl / triton.testing.do_bench(f, warmup=25, rep=200, return_mode="median") / 1e9
for name, (B, M, N, K) in {"bmm32x2048x2048x128": (32, 2048, 2048, 128), "bmm16x4096x4096x128": (16, 4096, 4096, 128),
                           "mm8192x8192x256": (1, 8192, 8192, 256), "mm4096^3": (1, 4096, 4096, 4096),
                           "mm8192x4096x4096": (1, 8192, 4096, 4096)}.items():
    if B > 1:
        a = torch.randn(B, M, K, device="cuda", dtype=torch.bfloat16); b = torch.randn(B, K, N, device="cuda", dtype=torch.bfloat16)
        run = lambda cfg: rt.bmm(a, b, torch.bfloat16, config=cfg); peer = lambda: torch.bmm(a, b)
    else:
        a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16); b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
        run = lambda cfg: rt.gemm(a, b, None, torch.bfloat16, config=cfg); peer = lambda: torch.mm(a, b)
    fl = 2 * B * M * N * K
    ref = peer().float()
    row = {"case": name, "cublas": tf(fl, peer), "chosen": rt.choose_config(B * M, N, K)}
    for cfg in rt.CONFIGS:
        try:
            o = run(cfg); torch.cuda.synchronize()
            row[cfg] = round(tf(fl, lambda: run(cfg)), 1)
            row[cfg + "_err"] = ((o.float() - ref).norm() / ref.norm()).item()
        except Exception as e:
            row[cfg] = repr(e)[:200]
    print(json.dumps(row), flush=True); rows.append(row)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "sweep.json"), "w"), indent=1)
