"""A Llama-style decoder stack (Llama-3-8B layer dims by default), for benchmarks and examples.

    cfg = LlamaConfig()                                   # hidden 4096, 32 q / 8 kv heads, d 128, SwiGLU 14336
    model = build_model(cfg, device="cuda", dtype=torch.bfloat16)
    y = model(x)                                          # x, y: hidden states [B, S, hidden]

Prefill only (no KV cache), no embedding or LM head: the stack is RMSNorm -> attention (RoPE, causal SDPA,
grouped-query) -> residual -> RMSNorm -> SwiGLU MLP -> residual, repeated, then a final RMSNorm. All linear
layers have no bias. ``gqa="native"`` calls SDPA with ``enable_gqa=True``; ``gqa="repeat"`` expands k/v
first (the Hugging Face ``repeat_kv`` form).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class LlamaConfig:
    hidden: int = 4096
    n_heads: int = 32
    n_kv_heads: int = 8
    head_dim: int = 128
    ffn: int = 14336
    n_layers: int = 4
    eps: float = 1e-5
    rope_theta: float = 500000.0
    max_seq_len: int = 16384
    gqa: str = "native"  # "native" | "repeat"


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rope_tables(cfg: LlamaConfig, seqlen: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [seqlen, head_dim] in fp32 (frequencies repeated over both halves, rotate-half convention)."""
    exponents = torch.arange(0, cfg.head_dim, 2, device=device, dtype=torch.float32) / cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** exponents)
    t = torch.arange(seqlen, device=device, dtype=torch.float32)
    freqs = torch.outer(t, inv)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.cfg = cfg
        self.wq = nn.Linear(cfg.hidden, cfg.n_heads * cfg.head_dim, bias=False)
        self.wk = nn.Linear(cfg.hidden, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.hidden, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.hidden, bias=False)
        #: Replaces SDPA when set: ``fn(q, k, v, is_causal=, enable_gqa=) -> out`` (the benchmark's fp32 reference).
        self.sdpa = None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        B, S, _ = x.shape
        q = self.wq(x).view(B, S, cfg.n_heads, cfg.head_dim).transpose(1, 2)
        k = self.wk(x).view(B, S, cfg.n_kv_heads, cfg.head_dim).transpose(1, 2)
        v = self.wv(x).view(B, S, cfg.n_kv_heads, cfg.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        gqa = cfg.n_kv_heads != cfg.n_heads
        if gqa and cfg.gqa == "repeat":
            rep = cfg.n_heads // cfg.n_kv_heads
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
            gqa = False
        sdpa = self.sdpa or F.scaled_dot_product_attention
        o = sdpa(q, k, v, is_causal=True, enable_gqa=gqa)
        return self.wo(o.transpose(1, 2).reshape(B, S, cfg.n_heads * cfg.head_dim))


class MLP(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.w1 = nn.Linear(cfg.hidden, cfg.ffn, bias=False)  # gate
        self.w3 = nn.Linear(cfg.hidden, cfg.ffn, bias=False)  # up
        self.w2 = nn.Linear(cfg.ffn, cfg.hidden, bias=False)  # down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.hidden, cfg.eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.hidden, cfg.eps)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))


class LlamaDecoder(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.hidden, cfg.eps)
        cos, sin = rope_tables(cfg, cfg.max_seq_len)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        S = x.shape[1]
        if S > self.cfg.max_seq_len:
            raise ValueError(f"sequence length {S} > max_seq_len {self.cfg.max_seq_len}")
        cos, sin = self.rope_cos[:S], self.rope_sin[:S]
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.norm(x)


def build_model(cfg: LlamaConfig | None = None, device="cuda", dtype=torch.bfloat16, seed: int = 0) -> LlamaDecoder:
    """A randomly initialised decoder in eval mode; RoPE tables stay fp32 whatever ``dtype`` is."""
    cfg = cfg or LlamaConfig()
    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaDecoder(cfg)
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            nn.init.normal_(p, mean=1.0, std=0.1)  # not all ones: a broken scale would show
    model.to(dtype)
    model.rope_cos = model.rope_cos.float()
    model.rope_sin = model.rope_sin.float()
    return model.eval()


def layer_params(cfg: LlamaConfig) -> int:
    attn = cfg.hidden * cfg.head_dim * (2 * cfg.n_heads + 2 * cfg.n_kv_heads)
    return attn + 3 * cfg.hidden * cfg.ffn


def forward_flops(cfg: LlamaConfig, batch: int, seqlen: int) -> float:
    """GEMM FLOPs (2 per MAC) plus causal attention FLOPs (4*B*H*S^2*D / 2), over all layers."""
    gemm = 2.0 * batch * seqlen * layer_params(cfg)
    attn = 4.0 * batch * cfg.n_heads * seqlen * seqlen * cfg.head_dim / 2
    return cfg.n_layers * (gemm + attn)


def train_flops(cfg: LlamaConfig, batch: int, seqlen: int) -> float:
    """A training step's FLOPs: the GEMMs three times (forward, then dX and dW), causal attention 3.5 times
    (forward, then the backward's five matmuls against the forward's two), over all layers."""
    gemm = 2.0 * batch * seqlen * layer_params(cfg)
    attn = 4.0 * batch * cfg.n_heads * seqlen * seqlen * cfg.head_dim / 2
    return cfg.n_layers * (3 * gemm + 3.5 * attn)
