"""CPU checks of the parts the GPU runs use: the Llama stack, FLOP counts, the chunked attention reference,
the kernel-name classifier of the model's GPU-time split."""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from torch_autows.bench import cases, llama
from torch_autows.bench.model import classify_kernel, split_from_events, tolerance
from torch_autows.bench.peers_attention import attention_fp32
from torch_autows.ops import torch_attention

TINY = llama.LlamaConfig(hidden=64, n_heads=4, n_kv_heads=2, head_dim=16, ffn=96, n_layers=2, max_seq_len=32)


def test_llama_forward_gqa_modes_agree():
    model = llama.build_model(TINY, device="cpu", dtype=torch.float32, seed=1)
    x = torch.randn(2, 24, TINY.hidden)
    y = model(x)
    assert y.shape == x.shape and torch.isfinite(y).all()
    rep = llama.LlamaDecoder(dataclasses.replace(TINY, gqa="repeat"))
    rep.load_state_dict(model.state_dict())
    torch.testing.assert_close(rep.eval()(x), y, rtol=1e-5, atol=1e-5)


def test_llama_is_causal():
    model = llama.build_model(TINY, device="cpu", dtype=torch.float32, seed=2)
    x = torch.randn(1, 16, TINY.hidden)
    x2 = x.clone()
    x2[:, 10:] = torch.randn(1, 6, TINY.hidden)
    torch.testing.assert_close(model(x)[:, :10], model(x2)[:, :10])


def test_llama_bf16_keeps_fp32_rope():
    model = llama.build_model(TINY, device="cpu", dtype=torch.bfloat16)
    assert model.layers[0].attn.wq.weight.dtype == torch.bfloat16 and model.rope_cos.dtype == torch.float32
    with pytest.raises(ValueError):
        model(torch.randn(1, TINY.max_seq_len + 1, TINY.hidden, dtype=torch.bfloat16))


def test_flops():
    cfg = llama.LlamaConfig()
    assert llama.layer_params(cfg) == 4096 * 128 * 80 + 3 * 4096 * 14336  # 218 M per layer
    want = 4 * (2 * 16384 * llama.layer_params(cfg) + 4 * 8 * 32 * 2048**2 * 128 / 2)
    assert cases.ModelCase(8, 2048).flops == pytest.approx(want)
    assert cases.GemmCase("bmm", 2048, 2048, 128, batch=32).flops == 2 * 32 * 2048 * 2048 * 128
    a = cases.AttnCase(4, 16, 16, 4096, 128, causal=True)
    assert a.flops == 4 * 4 * 16 * 4096**2 * 128 / 2
    grid = cases.attention_cases()
    llama31 = [c for c in grid if c.heads == 64]  # NVIDIA's published cuDNN shapes: batch 1, 2k-32k
    assert len(llama31) == 10 and all(c.batch == 1 and c.kv_heads == 8 and c.head_dim == 128 for c in llama31)
    assert all(c.batch * c.seqlen == cases.TOKENS for c in grid if c not in llama31)
    assert all(c.heads * c.head_dim == cases.HIDDEN for c in grid if not c.gqa and c.head_dim in (64, 128))
    wide = [c for c in grid if c.head_dim not in (64, 128)]  # 16 heads: 96 and 192 divide no 2048
    assert {c.head_dim for c in wide} == {96, 192, 256} and all(c.heads == c.kv_heads == 16 for c in wide)


@pytest.mark.parametrize("causal", [False, True])
def test_attention_reference_matches_torch(causal):
    torch.manual_seed(0)
    q = torch.randn(2, 4, 40, 16, dtype=torch.bfloat16)
    k = torch.randn(2, 2, 40, 16, dtype=torch.bfloat16)
    v = torch.randn(2, 2, 40, 16, dtype=torch.bfloat16)
    scale = 16 ** -0.5
    # tiny chunks: several heads and row blocks per step, remainder blocks included
    out, lse = attention_fp32(q, k, v, causal, scale, chunk_bytes=4 * 40 * 12 * 3)
    want_out, want_lse = torch_attention(q, k, v, causal, scale)
    torch.testing.assert_close(out.to(torch.bfloat16), want_out)
    torch.testing.assert_close(lse, want_lse)
    sdpa = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal,
                                                            scale=scale, enable_gqa=True)
    torch.testing.assert_close(out, sdpa, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name,cls", [
    ("nvjet_tst_256x128_64x4_1x2_h_bz_coopB_NNT", "gemm"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1", "gemm"),
    ("triton_tem_fused_mm_0", "gemm"),
    ("ws_matmul_kernel", "gemm"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x128x128_4x1x1", "attention"),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>", "attention"),
    ("triton_tem_fused_flex_attention_0", "attention"),
    ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0", "rest"),
    ("triton_poi_fused_mul_silu_1", "rest"),
    ("triton_poi_fused__scaled_dot_product_cudnn_attention__to_copy__unsafe_view_add_cat_mul", "rest"),  # RoPE
    ("triton_per_fused_attn_norm_mm_3", "rest"),
    ("void at::native::elementwise_kernel<128, 2>", "rest"),
])
def test_classify_kernel(name, cls):
    assert classify_kernel(name) == cls


def test_split_from_events():
    events = [("nvjet_x", 3000.0), ("cudnn_sdpa_flash", 600.0), ("triton_poi_fused_add", 300.0)]
    sp = split_from_events(events, iters=3)
    assert sp["gemm_ms"] == pytest.approx(1.0) and sp["attention_ms"] == pytest.approx(0.2)
    assert sp["rest_ms"] == pytest.approx(0.1) and sp["top_kernels"][0] == ["nvjet_x", 1.0, "gemm"]


def test_model_tolerance_follows_eager():
    assert tolerance(None, []) == 1e-2
    assert tolerance(None, [{"impl": "eager", "rel_err": 0.002}]) == 1e-2
    assert math.isclose(tolerance(None, [{"impl": "eager", "rel_err": 0.008}]), 0.016)
    assert tolerance(None, [{"impl": "eager", "rel_err": 0.5, "error": "x"}]) == 1e-2


def test_llama_sdpa_hook_with_fp32_reference_attention():
    from torch_autows.bench.model import _fp32_sdpa

    model = llama.build_model(TINY, device="cpu", dtype=torch.float32, seed=3)
    x = torch.randn(2, 20, TINY.hidden)
    y = model(x)
    for layer in model.layers:
        layer.attn.sdpa = _fp32_sdpa
    torch.testing.assert_close(model(x), y, rtol=1e-5, atol=1e-5)


def test_train_step_repeats_its_gradients_and_keeps_weights():
    """The train work's step: AdamW at lr 0 runs but moves no weight, so the warm, checked and timed calls all
    return the same gradients (the first block's and the final norm's), which reach the end of the backward."""
    from torch_autows.bench import train

    model = llama.build_model(TINY, device="cpu", dtype=torch.float32, seed=3).train()
    x, dy = torch.randn(2, 12, TINY.hidden), torch.randn(2, 12, TINY.hidden)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    step = train._step(model, model, x, dy)
    g1, g2 = step(), step()
    assert g1.numel() == sum(p.numel() for p in train._probes(model)) and bool(g1.abs().sum() > 0)
    torch.testing.assert_close(g1, g2)
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, before[k], rtol=0, atol=0)


def test_train_flops_and_case():
    cfg = llama.LlamaConfig()
    gemm, attn = 2 * 16384 * llama.layer_params(cfg), 4 * 8 * 32 * 2048**2 * 128 / 2
    assert cases.TrainCase(8, 2048).flops == pytest.approx(4 * (3 * gemm + 3.5 * attn))
    assert [c.name for c in cases.select("train")] == ["8x2048"]
