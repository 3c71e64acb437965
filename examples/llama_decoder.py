"""Llama decoder layers (RMSNorm, RoPE, GQA attention, SwiGLU MLP): eager vs Inductor vs autows.

    python examples/llama_decoder.py                  # CUDA if present (bf16), else a small CPU run (fp32)
    python examples/llama_decoder.py --device cpu     # on CPU: autows falls back, says why, times nothing
    python examples/llama_decoder.py --train --dynamic
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from _common import finish, hidden_states, parser, run


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-6):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(d)), eps

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def rope(x, theta: float = 10000.0):
    """Rotary embedding of x [B, H, S, D] (rotate-half form, positions 0..S-1)."""
    S, D = x.shape[-2], x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, D, 2, device=x.device, dtype=torch.float32) / D)
    ang = torch.outer(torch.arange(S, device=x.device, dtype=torch.float32), inv)
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1).to(x.dtype), torch.cat([ang.sin(), ang.sin()], -1).to(x.dtype)
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class Decoder(nn.Module):
    def __init__(self, d: int, heads: int, kv_heads: int, ffn: int):
        super().__init__()
        self.h, self.kvh, self.hd = heads, kv_heads, d // heads
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, kv_heads * self.hd, bias=False)
        self.v_proj = nn.Linear(d, kv_heads * self.hd, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)
        self.gate, self.up = nn.Linear(d, ffn, bias=False), nn.Linear(d, ffn, bias=False)
        self.down = nn.Linear(ffn, d, bias=False)
        self.norm1, self.norm2 = RMSNorm(d), RMSNorm(d)

    def forward(self, x):
        B, S, D = x.shape
        h = self.norm1(x)
        q = rope(self.q_proj(h).view(B, S, self.h, self.hd).transpose(1, 2))
        k = rope(self.k_proj(h).view(B, S, self.kvh, self.hd).transpose(1, 2))
        v = self.v_proj(h).view(B, S, self.kvh, self.hd).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.o_proj(a.transpose(1, 2).reshape(B, S, D))
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--dim", type=int, default=None, help="model width (default: per device)")
    p.add_argument("--heads", type=int, default=None, help="attention heads (default: per device)")
    p.add_argument("--kv-heads", type=int, default=None, help="key/value heads, GQA (default: per device)")
    p.add_argument("--ffn", type=int, default=None, help="SwiGLU hidden size (default: per device)")
    args = finish(p.parse_args(), dict(batch=4, seq=1024, dim=2048, heads=16, kv_heads=4, ffn=5632),
                  dict(batch=2, seq=64, dim=256, heads=4, kv_heads=2, ffn=688))
    make_model = lambda: nn.Sequential(*[Decoder(args.dim, args.heads, args.kv_heads, args.ffn)  # noqa: E731
                                         for _ in range(args.layers)])
    run("llama_decoder", make_model, hidden_states(args), args)


if __name__ == "__main__":
    main()
