"""Attention configs (every runtime config plus named variants) against cuDNN on the bench attention grid, one process.

Run on the GPU machine: ``PYTHONPATH=. OUT=<dir> python bench/results/sweeps/attention_configs.py [glob ...]``;
``CONFIGS=a,b`` in the environment times only these configs and variants (default: every one).
Writes ``sweep_attn_configs.json``: per case and variant the median TFLOP/s of ``ROUNDS`` interleaved
timings (cuDNN and every variant once per round, so clock and power drift hit all alike) and the relative
error against fp32 SDPA.
"""
import contextlib
import json
import os
import statistics
import sys
from dataclasses import replace

import torch
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

from torch_autows.bench.cases import select
from torch_autows.bench.runner import rel_err
from torch_autows.runtime import attention as rta

#: Extra variants: name -> (base config, Options overrides); with CONFIGS= these reproduce the JSONs' names.
#: -configs-2: every config plus q2_forward, q2_g4, q2_g8 (the serpentine JSON had q2_forward only).
#: -configs-3: CONFIGS=ws_p_128x128_q2,ws_p_128x128_q2_rm,ws_p_128x128_q2_rm_g8,q2_rm_g4,q2_rm_g16,
#:             ws_p3_192x128_q2,ws_p3_192x128_q2_rm,p3_rm_g8 (q2_rm_g16 is today's ws_p_128x128_q2_rm_g16,
#:             p3_rm_g8 today's ws_p3_192x128_q2_rm_g8).
VARIANTS = {"q2_forward": ("ws_p_128x128_q2", {"serpentine": False}),
            "q2_g4": ("ws_p_128x128_q2", {"group_m": 4}), "q2_g8": ("ws_p_128x128_q2", {"group_m": 8}),
            "ws_p_128x128_q2_rm_g8": ("ws_p_128x128_q2_rm", {"group_m": 8}),
            "q2_rm_g4": ("ws_p_128x128_q2_rm", {"group_m": 4}), "q2_rm_g16": ("ws_p_128x128_q2_rm", {"group_m": 16}),
            "ws_p3_192x128_q2_rm": ("ws_p3_192x128_q2_rm_g8", {"group_m": 1}),
            "p3_rm_g8": ("ws_p3_192x128_q2_rm_g8", {}),
            # next: 64 keys per step for short (causal) sequences, less masked work on the diagonal
            "q2_rm_g16_bn64": ("ws_p_128x128_q2_rm_g16", {"block_n": 64}),
            "q2_rm_g16_bn64_s6": ("ws_p_128x128_q2_rm_g16", {"block_n": 64, "stages": 6}),
            # -split-d-2: d=192 in column pieces, deeper K/V rings, ping-pong, P V deferred with one or two Q copies
            "sd_s3": ("ws_p_128x64_rm_g16_sd", {"stages": 3}),
            "sd_pp": ("ws_p_128x64_rm_g16_sd", {"pingpong": True}),
            "sd_dm1": ("ws_p_128x64_rm_g16_sd", {"defer_mma": True}),
            "sd_dm1_s3": ("ws_p_128x64_rm_g16_sd", {"defer_mma": True, "stages": 3}),
            "sd_dm_s1": ("ws_p_128x64_rm_g16_sd", {"defer_mma": True, "tile_buffers": 2, "stages": 1}),
            "sd_dm_bn32_s6": ("ws_p_128x64_rm_g16_sd", {"defer_mma": True, "block_n": 32, "stages": 6}),
            # -d256: P V deferred at d=256 (consumers at 240 registers: at 232 it spills 8 bytes), 64 or 32 keys a step
            "w256_dm": ("ws_p_128x64_rm_g16", {"defer_mma": True, "producer_regs": 24}),
            "w256_dm_bn32_s4": ("ws_p_128x64_rm_g16", {"defer_mma": True, "producer_regs": 24, "block_n": 32,
                                                       "stages": 4}),
            "w256_bn32_s4": ("ws_p_128x64_rm_g16", {"block_n": 32, "stages": 4}),
            # -d256-2: the deferred d=256 kernel re-measured since ptxas stopped serializing (0 spills, 0 waits
            # injected offline), and with both Q K^T chains issued before the deferred P V (lead_chains)
            "w256_dm_lc": ("ws_p_128x64_rm_g16", {"defer_mma": True, "producer_regs": 24, "lead_chains": True}),
            # -d256-3: ... with a third V slot (K 2 + V 3, 229472 bytes of SMEM): V is read a step late, so with two
            # slots its ring had one load ahead of the mma
            "w256_dm_s3": ("ws_p_128x64_rm_g16", {"defer_mma": True, "producer_regs": 24, "stages": 3}),
            "w256_dm_lc_s3": ("ws_p_128x64_rm_g16", {"defer_mma": True, "producer_regs": 24, "lead_chains": True,
                                                     "stages": 3}),
            # -pp-2: the d=128 pick with ping-pong again (raw_max, o_tma since -pingpong), or consumers at 240 registers
            "q2_rm_g16_pp": ("ws_p_128x128_q2_rm_g16", {"pingpong": True}),
            "q2_rm_g16_r24": ("ws_p_128x128_q2_rm_g16", {"producer_regs": 24}),
            # d=96 in three consumer warpgroups of 64 rows (FA3's 192-row tile at d<=96), binary pieces 64 + 32,
            # two K / three V slots (172 KB; 0 spills offline, causal or not)
            "p3_sdb": ("ws_p3_192x128_q2_rm_g8", {"split_d": True, "split_d_binary": True, "stages": 2}, (96,)),
            "p3_sdb_g16": ("ws_p3_192x128_q2_rm_g8", {"split_d": True, "split_d_binary": True, "stages": 2,
                                                      "group_m": 16}, (96,)),
            # the picks in pieces with every Q K^T piece issued before step j-1's deferred P V (lead_chains)
            "sd_dm_s3_lc": ("ws_p_128x64_rm_g16_sd_dm_s3", {"lead_chains": True}),
            "sdb_dm_s3_lc": ("ws_p_128x64_rm_g16_sdb_dm_s3", {"lead_chains": True}),
            "q2_sd_lc": ("ws_p_128x128_q2_rm_g16_sd", {"lead_chains": True}),
            "q2_sdb_lc": ("ws_p_128x128_q2_rm_g16_sdb", {"lead_chains": True}),
            # -ctas (names as the runs had them): two or three CTAs an SM of one 64-row consumer each
            # (Options.ctas_per_sm) for short causal sequences: 128- or 64-key steps, P V not deferred, the causal
            # walk's grouping, one Q copy; and d=192's pick with two Q copies (ws_p_128x64_rm_g16_sdb_dm_s3_lc_q2)
            "ws_p2_64x128_q2_rm_g16": ("ws_p_64x64_q2_rm_g16_c2", {"block_n": 128}, (64,)),
            "ws_p2_64x128_q2_rm_g16_nd": ("ws_p_64x64_q2_rm_g16_c2", {"block_n": 128, "defer_mma": False}, (64,)),
            "ws_p2_64x64_q2_rm_g16": ("ws_p_64x64_q2_rm_g16_c2", {}),
            "c2_g8": ("ws_p_64x64_q2_rm_g16_c2", {"block_n": 128, "group_m": 8}, (64,)),
            "c2_g1": ("ws_p_64x64_q2_rm_g16_c2", {"block_n": 128, "group_m": 1}, (64,)),
            "c2_q1": ("ws_p_64x64_q2_rm_g16_c2", {"block_n": 128, "tile_buffers": 1}, (64,)),
            "c3_64x64": ("ws_p_64x64_q2_rm_g16_c3", {}),
            "c2_64x64_g8": ("ws_p_64x64_q2_rm_g16_c2", {"group_m": 8}),
            "sdb_lc_q2": ("ws_p_128x64_rm_g16_sdb_dm_s3_lc_q2", {}),
            # -p3-d128 (session 23): d=128 in three consumer warpgroups of 64 rows (192-row tiles) with 64 keys a
            # step, P V deferred or not, a K/V ring of 4 or 3 (0 spills offline; 128 keys a step spill)
            "p3_192x64_d128": ("ws_p3_192x128_q2_rm_g8", {"block_n": 64}, (128,)),
            "p3_192x64_dm_d128": ("ws_p3_192x128_q2_rm_g8", {"block_n": 64, "defer_mma": True}, (128,)),
            "p3_192x64_dm_s3_d128": ("ws_p3_192x128_q2_rm_g8", {"block_n": 64, "defer_mma": True, "stages": 3},
                                     (128,)),
            # -q-regs (session 23): the picks with Q read into registers once a tile (Options.q_regs: Q K^T's A from
            # registers, only K from SMEM each step); 0 spills offline but at d=256 (992 bytes: not a variant)
            "qr_d128": ("ws_p_128x128_q2_rm_g16", {"q_regs": True}, (64, 128)),
            "qr_pp": ("ws_p_128x128_q2_rm_g16_pp", {"q_regs": True}, (128,)),
            "qr_p3": ("ws_p3_192x128_q2_rm_g8", {"q_regs": True}, (64,)),
            "qr_sdb96": ("ws_p_128x128_q2_rm_g16_sdb", {"q_regs": True}, (96,)),
            "qr_d192": ("ws_p_128x64_rm_g16_sdb_dm_s3_lc", {"q_regs": True}, (192,)),
            "qr_d192_q2": ("ws_p_128x64_rm_g16_sdb_dm_s3_lc_q2", {"q_regs": True}, (192,)),
            # to measure next: d=128 with Q in registers and the consumers at 240 registers (producer 24), where the
            # mask's spills shrink from 88 to 8 bytes (O by TMA; 0 by pointer), ping-pong 16; unmasked 0 (offline)
            "qr_d128_r24": ("ws_p_128x128_q2_rm_g16", {"q_regs": True, "producer_regs": 24}, (128,)),
            "qr_pp_r24": ("ws_p_128x128_q2_rm_g16_pp", {"q_regs": True, "producer_regs": 24}, (128,)),
            # to measure next (-group; sessions 24 and 25 got no machine for it): the causal walk's grouping (query
            # tiles of a head run back to back) at the wide head dims, where short causal sequences trail cuDNN
            "w256_g1": ("ws_p_128x64_rm_g16_dm_s3", {"group_m": 1}),
            "w256_g4": ("ws_p_128x64_rm_g16_dm_s3", {"group_m": 4}),
            "w256_g8": ("ws_p_128x64_rm_g16_dm_s3", {"group_m": 8}),
            "w256_noserp": ("ws_p_128x64_rm_g16_dm_s3", {"serpentine": False}),
            "d192_q2_qr_g4": ("ws_p_128x64_rm_g16_sdb_dm_s3_lc_q2_qr", {"group_m": 4}),
            "d192_q2_qr_g8": ("ws_p_128x64_rm_g16_sdb_dm_s3_lc_q2_qr", {"group_m": 8})}
#: Variants that are a config with O stored by pointer where the grid's whole query tiles would take the TMA store
#: from the Q slot (o_tma): the pointer form releases a lone Q slot after its last reader (the last Q K^T, or the
#: register read with q_regs), so the producer loads the next tile's Q under this tile's last steps and epilogue;
#: the TMA form holds it until O is stored. Name -> config.
POINTER_STORE = {"w256_optr": "ws_p_128x64_rm_g16_dm_s3", "d192_qr_optr": "ws_p_128x64_rm_g16_sdb_dm_s3_lc_qr",
                 "d192_q2_qr_optr": "ws_p_128x64_rm_g16_sdb_dm_s3_lc_q2_qr"}
ROUNDS = 3


def add_variants() -> None:
    """``VARIANTS`` into the runtime's tables: (base config, Options overrides[, head dims served])."""
    for name, (base, kw, *dims) in VARIANTS.items():
        rta.CONFIGS[name] = replace(rta.CONFIGS[base], **kw)
        if dims or base in rta.HEAD_DIMS:
            rta.HEAD_DIMS[name] = dims[0] if dims else rta.HEAD_DIMS[base]
    for name, base in POINTER_STORE.items():
        rta.CONFIGS[name], rta.HEAD_DIMS[name] = rta.CONFIGS[base], rta.HEAD_DIMS[base]


@contextlib.contextmanager
def pointer_store(on: bool):
    """runtime.attention's o_tma_ok answering False while ``on`` (the call then plans and binds the pointer form)."""
    saved = rta.o_tma_ok
    if on:
        rta.o_tma_ok = lambda *args, **kw: False
    try:
        yield
    finally:
        rta.o_tma_ok = saved


def main():
    add_variants()
    names = list(rta.CONFIGS)
    if os.environ.get("CONFIGS"):
        names = [n for n in os.environ["CONFIGS"].split(",") if n in rta.CONFIGS]
    rows = []
    for c in select("attention", sys.argv[1:] or None):
        if c.head_dim_v:  # q/k and v of two head dims: attention_mla.py times those
            continue
        b, hq, hkv, s, d, causal = c.batch, c.heads, c.kv_heads, c.seqlen, c.head_dim, c.causal
        q = torch.randn(b, hq, s, d, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(b, hkv, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        # fp32 by the memory-efficient kernel (memory linear in S: the math path's S^2 ran out at gqa64x8-s16384)
        with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
            ref = torch.nn.functional.scaled_dot_product_attention(
                q.float(), *(t.float().repeat_interleave(hq // hkv, dim=1) for t in (k, v)), is_causal=causal)

        def cudnn(q=q, k=k, v=v, causal=causal, gqa=hkv != hq):
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)

        fns, row = {"cudnn": cudnn}, {"case": c.name}
        for name in (n for n in names if rta.serves(n, d, causal=causal)):
            def run(name=name, q=q, k=k, v=v, causal=causal, d=d):
                with pointer_store(name in POINTER_STORE):
                    return rta.attention(q, k, v, causal, d ** -0.5, config=name)
            try:
                out, _ = run()
                torch.cuda.synchronize()
                row[name + "_err"] = round(rel_err(out, ref), 5)
                fns[name] = run
            except Exception as e:  # recorded, not fatal
                row[name] = repr(e)[:300]
        times = {n: [] for n in fns}
        for _ in range(ROUNDS):
            for n, fn in fns.items():
                times[n].append(triton.testing.do_bench(fn, rep=80))
        for n, ts in times.items():
            row[n] = round(c.flops / statistics.median(ts) / 1e9, 1)
        print(json.dumps(row), flush=True)
        rows.append(row)
        del q, k, v, ref
        with open(os.path.join(os.environ.get("OUT", "."), "sweep_attn_configs.json"), "w") as f:
            json.dump(rows, f, indent=1)  # after every case, so a cut-short run still leaves its rows


if __name__ == "__main__":
    main()
