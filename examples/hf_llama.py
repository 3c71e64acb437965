"""Hugging Face ``LlamaForCausalLM`` (small config, random weights, no download): eager vs Inductor vs autows.

    python examples/hf_llama.py                 # needs `transformers`; CUDA if present, else a small CPU run
    python examples/hf_llama.py --device cpu --train
"""
from __future__ import annotations

import sys

import torch
from _common import finish, parser, run


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--dim", type=int, default=None, help="hidden size (default: per device)")
    p.add_argument("--vocab", type=int, default=None, help="vocabulary size (default: per device)")
    args = p.parse_args()  # before the import, so --help works without transformers
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as e:
        print(f"hf_llama: not run: `transformers` cannot be imported ({e}); pip install transformers",
              file=sys.stderr)
        return
    args = finish(args, dict(batch=4, seq=1024, dim=2048, vocab=32000), dict(batch=2, seq=64, dim=256, vocab=1000))
    heads = max(args.dim // 128, 4)
    cfg = LlamaConfig(vocab_size=args.vocab, hidden_size=args.dim, intermediate_size=int(args.dim * 2.6875) // 8 * 8,
                      num_hidden_layers=args.layers, num_attention_heads=heads, num_key_value_heads=max(heads // 4, 1),
                      max_position_embeddings=max(2048, args.seq), use_cache=False, attn_implementation="sdpa")

    def make_model():
        m = LlamaForCausalLM(cfg)
        m.config.use_cache = False
        return m

    def make_inputs(device, dtype):
        g = torch.Generator().manual_seed(0)
        return [torch.randint(0, args.vocab, (args.batch, args.seq), generator=g).to(device)]

    run("hf_llama", make_model, make_inputs, args)


if __name__ == "__main__":
    main()
