"""GPT-2 blocks (LayerNorm, fused QKV, causal attention, GELU MLP): eager vs Inductor vs autows.

    python examples/gpt2_block.py                    # CUDA if present (bf16), else a small CPU run (fp32)
    python examples/gpt2_block.py --device cpu       # on CPU: autows falls back, says why, times nothing
    python examples/gpt2_block.py --explicit --train # Hugging Face style matmul/softmax attention, fwd+bwd
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from _common import finish, hidden_states, parser, run


class Attention(nn.Module):
    def __init__(self, d: int, heads: int, explicit: bool):
        super().__init__()
        self.h, self.explicit = heads, explicit
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)

    def forward(self, x):
        B, S, D = x.shape
        q, k, v = self.c_attn(x).view(B, S, 3, self.h, D // self.h).permute(2, 0, 3, 1, 4)
        if self.explicit:  # transformers' eager attention: scores / sqrt(d), fp32 softmax, causal via SDPA-free mask
            w = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.size(-1))
            w = w.masked_fill(torch.ones(S, S, dtype=torch.bool, device=x.device).triu(1), float("-inf"))
            y = torch.matmul(F.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype), v)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(B, S, D))


class Block(nn.Module):
    def __init__(self, d: int, heads: int, explicit: bool = False):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = Attention(d, heads, explicit)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"), nn.Linear(4 * d, d))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--dim", type=int, default=None, help="model width (default: per device)")
    p.add_argument("--heads", type=int, default=None, help="attention heads (default: per device)")
    p.add_argument("--explicit", action="store_true", help="explicit matmul/softmax attention (masked: not served)")
    args = finish(p.parse_args(), dict(batch=8, seq=1024, dim=768, heads=12),
                  dict(batch=2, seq=128, dim=256, heads=4))
    make_model = lambda: nn.Sequential(*[Block(args.dim, args.heads, args.explicit)  # noqa: E731
                                         for _ in range(args.layers)])
    run("gpt2_block", make_model, hidden_states(args), args)


if __name__ == "__main__":
    main()
