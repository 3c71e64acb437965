"""Attention schedule variants (defer_mma x skip_mask) against cuDNN, in one process (H200).

Run on the GPU machine: ``PYTHONPATH=. OUT=<dir> python bench/results/sweeps/attention_schedule.py``.
"""
import json
import os
from dataclasses import replace

import torch
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

from torch_autows.runtime import attention as rta

SHAPES = [(4, 32, 4096, 128, False), (1, 16, 16384, 128, False), (4, 32, 4096, 128, True),
          (1, 16, 16384, 128, True), (8, 32, 4096, 64, False), (8, 32, 4096, 64, True),
          (16, 32, 1024, 128, True), (32, 32, 512, 64, False)]


def main():
    base = rta.CONFIGS["ws_p_128x128"]
    variants = {"defer+skip": base, "defer": replace(base, skip_mask=False), "skip": replace(base, defer_mma=False),
                "none": replace(base, defer_mma=False, skip_mask=False)}
    rta.CONFIGS.update(variants)
    rows = []
    for b, h, s, d, causal in SHAPES:
        q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        flop = 4 * b * h * s * s * d / (2 if causal else 1)
        ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
        def cudnn(q=q, k=k, v=v, causal=causal):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            t = triton.testing.do_bench(cudnn, rep=200)
        row = {"case": f"b{b}h{h}s{s}d{d}{'c' if causal else ''}", "cudnn": flop / t / 1e9}
        for name in variants:
            def run(name=name, q=q, k=k, v=v, causal=causal, d=d):
                return rta.attention(q, k, v, causal, d ** -0.5, config=name)
            try:
                out, _ = run()
                torch.cuda.synchronize()
                row[name + "_err"] = round(((out.float() - ref).norm() / ref.norm()).item(), 5)
                row[name] = round(flop / triton.testing.do_bench(run, rep=200) / 1e9, 1)
            except Exception as e:  # recorded, not fatal
                row[name] = repr(e)[:300]
        print(json.dumps(row), flush=True)
        rows.append(row)
    with open(os.path.join(os.environ.get("OUT", "."), "sweep_attn.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
