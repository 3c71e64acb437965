"""The benchmark cases of shared/BENCH.md: GEMM set, attention grid, model configs; FLOPs; selection by name."""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass


@dataclass(frozen=True)
class GemmCase:
    op: str  # "mm" | "bmm" | "addmm"
    M: int
    N: int
    K: int
    batch: int = 1
    dtype: str = "bf16"

    @property
    def name(self) -> str:
        mnk = f"{self.M}x{self.N}x{self.K}"
        prefix = "" if self.dtype == "bf16" else f"{self.dtype}:"
        if self.op == "bmm":
            return f"{prefix}bmm:{self.batch}x{mnk}"
        if self.op == "addmm":
            return f"{prefix}addmm:{mnk}"
        return prefix + mnk

    @property
    def flops(self) -> float:
        return 2.0 * self.batch * self.M * self.N * self.K

    def describe(self) -> str:
        shape = f"{self.batch} x " if self.op == "bmm" else ""
        return f"{self.op} {self.dtype} {shape}M={self.M} N={self.N} K={self.K}"


@dataclass(frozen=True)
class AttnCase:
    batch: int
    heads: int
    kv_heads: int
    seqlen: int
    head_dim: int
    causal: bool
    dtype: str = "bf16"
    head_dim_v: int = 0  # v's (and the output's) head dim where it differs from q's and k's (MLA prefill: 128)

    @property
    def gqa(self) -> bool:
        return self.kv_heads != self.heads

    @property
    def dv(self) -> int:
        return self.head_dim_v or self.head_dim

    @property
    def name(self) -> str:
        gqa = f"gqa{self.heads}x{self.kv_heads}-" if self.gqa else ""
        dv = f"v{self.dv}" if self.dv != self.head_dim else ""
        return f"{gqa}s{self.seqlen}-d{self.head_dim}{dv}" + ("-causal" if self.causal else "")

    @property
    def flops(self) -> float:
        f = 2.0 * self.batch * self.heads * self.seqlen * self.seqlen * (self.head_dim + self.dv)  # Q K^T and P V
        return f / 2 if self.causal else f

    def describe(self) -> str:
        dv = f" Dv={self.dv}" if self.dv != self.head_dim else ""
        return (f"{self.dtype} B={self.batch} Hq={self.heads} Hkv={self.kv_heads} S={self.seqlen} "
                f"D={self.head_dim}{dv} causal={self.causal}")


@dataclass(frozen=True)
class AttnBwdCase(AttnCase):
    """The backward of an attention case: dQ, dK, dV from dO and the forward's out and lse."""

    @property
    def flops(self) -> float:
        """2.5 x the forward's: five S x S x D GEMMs (S = QK^T again, dP = dO V^T, dV, dQ, dK) against two."""
        return 2.5 * super().flops

    def describe(self) -> str:
        return "backward " + super().describe()


@dataclass(frozen=True)
class ModelCase:
    batch: int
    seqlen: int
    layers: int = 4

    @property
    def name(self) -> str:
        return f"{self.batch}x{self.seqlen}"

    @property
    def flops(self) -> float:
        from .llama import LlamaConfig, forward_flops

        return forward_flops(LlamaConfig(n_layers=self.layers), self.batch, self.seqlen)

    def describe(self) -> str:
        return (f"Llama-3-8B-style decoder, {self.layers} layers, bf16 prefill, "
                f"batch {self.batch} x seqlen {self.seqlen}")


@dataclass(frozen=True)
class TrainCase(ModelCase):
    """One training step (forward, backward, AdamW) of the model work's decoder."""

    @property
    def flops(self) -> float:
        from .llama import LlamaConfig, train_flops

        return train_flops(LlamaConfig(n_layers=self.layers), self.batch, self.seqlen)

    def describe(self) -> str:
        return (f"Llama-3-8B-style decoder, {self.layers} layers, bf16 training step (fwd + bwd + AdamW), "
                f"batch {self.batch} x seqlen {self.seqlen}")


@dataclass(frozen=True)
class DecodeCase:
    """A decode GEMM: ``M`` rows of activations times a [K, N] weight (bf16). Memory-bound: ``bytes`` is the
    traffic of A, B and C, which the bench turns into an effective bandwidth."""

    M: int
    K: int
    N: int
    dtype: str = "bf16"
    op: str = "mm"
    batch: int = 1

    @property
    def name(self) -> str:
        return f"m{self.M}-{self.K}x{self.N}"

    @property
    def flops(self) -> float:
        return 2.0 * self.M * self.N * self.K

    @property
    def bytes(self) -> int:
        return 2 * (self.M * self.K + self.K * self.N + self.M * self.N)

    def describe(self) -> str:
        return f"mm {self.dtype} M={self.M} K={self.K} N={self.N} ({self.bytes / 1e6:.0f} MB)"


@dataclass(frozen=True)
class MlpCase:
    """A SwiGLU MLP (hidden -> ffn -> hidden, bf16, no bias) on ``rows`` tokens, through torch.compile;
    ``graphs``: both sides compiled with ``mode="reduce-overhead"`` (CUDA graphs, as decode loops run), so
    the host's launch overhead is out of both."""

    rows: int
    hidden: int = 4096
    ffn: int = 14336
    dtype: str = "bf16"
    graphs: bool = False

    @property
    def name(self) -> str:
        return f"mlp{self.hidden}x{self.ffn}-r{self.rows}" + ("-graphs" if self.graphs else "")

    @property
    def flops(self) -> float:
        return 2.0 * self.rows * 3 * self.hidden * self.ffn

    @property
    def bytes(self) -> int:
        return 2 * 3 * self.hidden * self.ffn

    def describe(self) -> str:
        return (f"MLP {self.hidden}->{self.ffn}->{self.hidden} bf16, {self.rows} rows, backend=autows vs default"
                + (', both mode="reduce-overhead"' if self.graphs else ""))


TOKENS = 16384
HIDDEN = 2048

_LLM = [(4096, 4096, 4096), (8192, 8192, 8192), (8192, 4096, 4096), (8192, 14336, 4096), (8192, 4096, 14336),
        (16384, 1024, 4096), (4096, 128256, 4096)]
_FP16_SUBSET = [(4096, 4096, 4096), (8192, 8192, 8192), (8192, 14336, 4096)]


def gemm_cases() -> list[GemmCase]:
    cases = [GemmCase("mm", m, n, k) for m, n, k in _LLM]
    cases.append(GemmCase("bmm", 2048, 2048, 128, batch=32))
    cases.append(GemmCase("addmm", 8192, 4096, 4096))
    cases += [GemmCase("mm", m, n, k, dtype="fp16") for m, n, k in _FP16_SUBSET]
    return cases


def attention_cases() -> list[AttnCase]:
    cases = []
    for d in (64, 128):
        for causal in (False, True):
            for s in (512, 1024, 2048, 4096, 8192, 16384):
                cases.append(AttnCase(TOKENS // s, HIDDEN // d, HIDDEN // d, s, d, causal))
    for causal in (False, True):
        for s in (4096, 8192):
            cases.append(AttnCase(TOKENS // s, 32, 8, s, 128, causal))
    # head dims served since in wider tiles (96 in 128 columns, 192 in 256) and 256: 16 heads (2048 is no multiple
    # of 96 or 192), as the fallback grid had them
    for d in (96, 192, 256):
        for causal in (False, True):
            for s in (1024, 4096, 16384):
                cases.append(AttnCase(TOKENS // s, 16, 16, s, d, causal))
    # the Llama-3.1 shapes NVIDIA publishes cuDNN 9.19's H200 figures for: GQA 64 q / 8 kv heads, d128, batch 1
    for causal in (False, True):
        for s in (2048, 4096, 8192, 16384, 32768):
            cases.append(AttnCase(1, 64, 8, s, 128, causal))
    # DeepSeek-style MLA prefill: q/k head dim 192 (128 nope + 64 rope), v 128; 16 heads as the other wide dims
    for causal in (False, True):
        for s in (1024, 4096, 16384):
            cases.append(AttnCase(TOKENS // s, 16, 16, s, 192, causal, head_dim_v=128))
    return cases


def attention_bwd_cases() -> list[AttnBwdCase]:
    """The attention grid's head dims 64 and 128 (s512-s16384, causal or not, GQA 32/8, the Llama-3.1 GQA 64/8 shapes),
    same names, as backwards."""
    return [AttnBwdCase(c.batch, c.heads, c.kv_heads, c.seqlen, c.head_dim, c.causal, c.dtype)
            for c in attention_cases() if c.head_dim in (64, 128)]


DECODE_M = (1, 8, 16, 32, 64, 128, 256)
#: Llama-3-8B / 70B weight shapes K x N: qkv, o, gate+up, down (8B); qkv, gate+up, down (70B).
DECODE_KN = [(4096, 6144), (4096, 4096), (4096, 28672), (14336, 4096), (8192, 10240), (8192, 57344), (28672, 8192)]


def decode_cases() -> list:
    cases: list = [DecodeCase(m, k, n) for k, n in DECODE_KN for m in DECODE_M]
    return cases + [MlpCase(r, graphs=g) for g in (False, True) for r in (1, 8, 64, 256)]


def fallback_cases() -> list[AttnCase]:
    """A head dim the generated attention does not serve (80; 96 and 256 are served since, in the attention grid):
    16 heads, 16k tokens per batch."""
    return [AttnCase(TOKENS // s, 16, 16, s, 80, causal) for causal in (False, True) for s in (1024, 4096)]


def model_cases() -> list[ModelCase]:
    return [ModelCase(8, 2048), ModelCase(1, 16384)]


def train_cases() -> list[TrainCase]:
    return [TrainCase(8, 2048)]


QUICK = {
    "gemm": ["4096x4096x4096", "8192x14336x4096", "bmm:32x2048x2048x128", "addmm:8192x4096x4096"],
    "attention": ["s2048-d128", "s2048-d128-causal", "s4096-d64", "gqa32x8-s4096-d128-causal"],
    "attention-bwd": ["s2048-d128", "s2048-d128-causal", "s4096-d64", "gqa32x8-s4096-d128-causal"],
    "model": ["8x2048"],
    "decode": ["m1-4096x4096", "m16-4096x28672", "m64-14336x4096", "mlp4096x14336-r8"],
    "fallback": ["s1024-d80", "s4096-d80-causal"],
    "train": ["8x2048"],
}

ALL = {"gemm": gemm_cases, "attention": attention_cases, "attention-bwd": attention_bwd_cases, "model": model_cases,
       "decode": decode_cases, "fallback": fallback_cases, "train": train_cases}


def select(work: str, names: list[str] | None = None, quick: bool = False) -> list:
    """Cases of one work in canonical order; ``names`` are exact names or fnmatch globs ("fp16:*")."""
    cases = ALL[work]()
    if quick and not names:
        names = QUICK[work]
    if not names:
        return cases
    picked = []
    for pat in names:
        hits = [c for c in cases if fnmatch.fnmatchcase(c.name, pat)]
        if not hits:
            known = ", ".join(c.name for c in cases)
            raise ValueError(f"no {work} case matches {pat!r}; known: {known}")
        picked += [c for c in hits if c not in picked]
    return [c for c in cases if c in picked]
