"""Attention schedule variants (defer_mma x skip_mask) against cuDNN, same process, fresh inputs."""
import json, os, torch, triton
from dataclasses import replace
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch_autows.runtime import attention as rta
base = rta.CONFIGS["ws_p_128x128"]
variants = {"defer+skip": base, "defer": replace(base, skip_mask=False), "skip": replace(base, defer_mma=False),
            "none": replace(base, defer_mma=False, skip_mask=False)}
for k, o in variants.items():
    rta.CONFIGS[k] = o
rows = []
for (b, h, s, d, causal) in [(4, 32, 4096, 128, False), (1, 16, 16384, 128, False), (4, 32, 4096, 128, True),
                             (1, 16, 16384, 128, True), (8, 32, 4096, 64, False), (8, 32, 4096, 64, True),
                             (16, 32, 1024, 128, True), (32, 32, 512, 64, False)]:
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    fl = 4 * b * h * s * s * d / (2 if causal else 1)
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        f = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        row = {"case": f"b{b}h{h}s{s}d{d}{'c' if causal else ''}", "cudnn": fl / triton.testing.do_bench(f, rep=200) / 1e9}
    for name in variants:
        try:
            o, _ = rta.attention(q, k, v, causal, d ** -0.5, config=name); torch.cuda.synchronize()
            err = ((o.float() - ref).norm() / ref.norm()).item()
            t = triton.testing.do_bench(lambda: rta.attention(q, k, v, causal, d ** -0.5, config=name), rep=200)
            row[name] = round(fl / t / 1e9, 1); row[name + "_err"] = round(err, 5)
        except Exception as e:
            row[name] = repr(e)[:300]
    print(json.dumps(row), flush=True); rows.append(row)
    del q, k, v, ref
json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "sweep_attn.json"), "w"), indent=1)
