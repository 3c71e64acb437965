"""GPU probe (not a test): the generated attention backward (runtime/attention_bwd.py: preprocess, dQ workspace
zeroing, main kernel, postprocess, i.e. what a user gets) against cuDNN's backward (attention_grad._cudnn_backward)
on a cuDNN forward's out and lse.

Cases: s1024/s4096/s8192 x d64/d128 x causal or not, B*S = 16384 tokens, hidden 2048 (H = 2048 / d), bf16.
Each time is the median of 3 interleaved rounds of triton.testing.do_bench. FLOPs = 2.5 x the forward's
4*B*H*S^2*D (5 GEMMs against 2), halved when causal. Prints one line per case (TFLOP/s each, ours / cuDNN, and
our gradients' error against cuDNN's) and writes JSON to argv[1], else $OUT/attention_bwd_probe.json.

    python bench/results/sweeps/attention_bwd_probe.py [out.json]
"""
from __future__ import annotations

import json
import os
import statistics
import sys

import torch
from triton.testing import do_bench

from torch_autows.attention_grad import _cudnn_backward
from torch_autows.runtime import attention_bwd
from torch_autows.sdpa_fallback import fused_attention


def _rel(x, ref) -> float:
    return ((x.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-6)).item()


def case(s: int, d: int, causal: bool) -> dict:
    B, H = 16384 // s, 2048 // d
    scale = d ** -0.5
    q, k, v, go = (torch.randn(B, H, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    out, lse = fused_attention("cudnn", q, k, v, causal, scale)  # cuDNN's forward: (out, lse [B, H, S])
    ours = lambda: attention_bwd.backward(go, None, q, k, v, out, lse, causal, scale)  # noqa: E731
    theirs = lambda: _cudnn_backward(go, q, k, v, out, lse, causal, scale)  # noqa: E731
    a, b = ours(), theirs()
    err = {n: _rel(x, y) for n, x, y in zip(("dq", "dk", "dv"), a, b)}
    times = {"autows": [], "cudnn": []}
    for _ in range(3):  # interleaved rounds
        times["autows"].append(do_bench(ours, warmup=25, rep=100))
        times["cudnn"].append(do_bench(theirs, warmup=25, rep=100))
    flops = 2.5 * 4 * B * H * s * s * d / (2 if causal else 1)
    ms = {n: statistics.median(t) for n, t in times.items()}
    tflops = {n: flops / (t * 1e-3) / 1e12 for n, t in ms.items()}
    return {"case": f"b{B}h{H}-s{s}-d{d}{'-causal' * causal}", "B": B, "H": H, "S": s, "D": d, "causal": causal,
            "ms": ms, "rounds_ms": times, "tflops": tflops, "ratio": ms["cudnn"] / ms["autows"],
            "config": attention_bwd.choose_config(d, causal), "err_vs_cudnn": err}


def main() -> None:
    rows = []
    for s in (1024, 4096, 8192):
        for d in (64, 128):
            for causal in (False, True):
                r = case(s, d, causal)
                rows.append(r)
                e = r["err_vs_cudnn"]
                print(f"{r['case']:>26}  autows {r['tflops']['autows']:6.1f}  cudnn {r['tflops']['cudnn']:6.1f} "
                      f"TFLOP/s  ratio {r['ratio']:.3f}  err dq {e['dq']:.1e} dk {e['dk']:.1e} dv {e['dv']:.1e}",
                      flush=True)
    ratios = [r["ratio"] for r in rows]
    geo = statistics.geometric_mean(ratios)
    print(f"geomean autows / cudnn (throughput): {geo:.3f}")
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.environ.get("OUT", "."), "attention_bwd_probe.json")
    with open(path, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "geomean_ratio": geo,
                   "cases": rows}, f, indent=1)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
