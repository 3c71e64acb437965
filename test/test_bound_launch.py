"""The runtimes' per-shape cache of bound launches (launch.Bound), checked on CPU with the GPU faked.

A repeated call with the same shapes, strides and dtypes passes only its tensors' addresses. What reaches
the C launcher must be exactly what the full path (support checks, config choice, plan, ``Launcher``)
sends for the same tensors: that is compared argument by argument, for GEMM, bmm and attention (q, k, v
read in place from a fused QKV projection)."""
from __future__ import annotations

import pytest
import torch
from triton import knobs

from torch_autows.runtime import attention as rta
from torch_autows.runtime import device as dev
from torch_autows.runtime import gemm as rtg
from torch_autows.runtime import launch
from torch_autows.runtime.fallback import Unsupported


@pytest.fixture
def fake_gpu(monkeypatch):
    """CPU tensors pass the device checks; compiling is skipped (the first call of a key records a direct
    state, as kernel[grid] would); the C launcher and CUtensorMap encoding are logged instead of run."""
    import triton.backends.nvidia.driver as driver

    log = []

    def raw(*args):  # a pointer goes to the C launcher as a tensor or its address: the same to it
        log.append(tuple(x.data_ptr() if isinstance(x, torch.Tensor) else x for x in args))

    def slow(self, grid, args, key, first):
        log.append("slow")
        if first:
            self._direct[key] = (raw, "function", "packed", False, False, [f"meta{i}" for i in range(len(self.descs))])

    def encode(a, meta):  # a map names the address, shape and strides it was encoded for
        return [("map", a.base.data_ptr(), tuple(a.shape), tuple(a.strides), meta), *a.shape, *a.strides]

    monkeypatch.setattr(launch.Launcher, "_slow", slow)
    monkeypatch.setattr(driver, "make_tensordesc_arg", encode)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda i: 7, raising=False)
    monkeypatch.setattr(dev, "sm90_reason", lambda device, check_device=True: None)
    monkeypatch.setattr(dev, "index", lambda device: 0)
    monkeypatch.setattr(dev, "num_sms", lambda i: 132)
    _forget()
    yield log
    _forget()  # no faked launcher state may outlive the test


def _forget():
    for rt in (rtg, rta):
        rt._BOUND.clear()
    launch.compile_kernel.cache_clear()  # the Launchers, with their direct states


def _bound_vs_full(log, cache: dict, call, make_inputs):
    """Call once (compiles), then with fresh inputs through the bound launch and through the full path."""
    call(*make_inputs())
    assert log == ["slow"] and len(cache) == 1
    inputs = make_inputs()
    call(*inputs)                   # bound
    saved = dict(cache)
    cache.clear()
    call(*inputs)                   # full path, direct launcher
    cache.update(saved)
    assert len(log) == 3 and log[1] == log[2], (log[1], log[2])
    return log[1]


def test_gemm_bound_launch_matches_the_full_path(fake_gpu):
    def inputs():
        return (torch.randn(256, 64).bfloat16(), torch.randn(96, 64).bfloat16().t(), torch.randn(96).bfloat16(),
                torch.empty(256, 96).bfloat16())

    def call(a, b, bias, out):
        assert rtg.gemm(a, b, bias, torch.bfloat16, out=out) is out

    args = _bound_vs_full(fake_gpu, rtg._BOUND, call, inputs)
    assert args[3] == 7 and args[:3] == (2 * 1, 1, 1)  # 2x1 tiles of 128x128 on 132 SMs; the current stream
    maps = [x for x in args[13:] if isinstance(x, tuple)]
    assert [m[2] for m in maps] == [(256, 64), (96, 64), (256, 96)]  # a, b read as its transpose, c


def test_bmm_bound_launch_matches_the_full_path(fake_gpu):
    def inputs():
        return torch.randn(2, 128, 64).half(), torch.randn(2, 64, 32).half(), torch.empty(2, 128, 32).half()

    args = _bound_vs_full(fake_gpu, rtg._BOUND, lambda a, b, out: rtg.bmm(a, b, torch.half, out=out), inputs)
    assert [x[2] for x in args[13:] if isinstance(x, tuple)] == [(256, 64), (128, 32), (256, 32)]


def test_attention_bound_launch_matches_the_full_path(fake_gpu):
    def inputs():  # q, k, v sliced from one fused projection [B, S, 3, H, D]: read in place, no copies
        q, k, v = torch.randn(2, 100, 3, 4, 64).bfloat16().permute(2, 0, 3, 1, 4)
        return q, k, v, rta.empty_out(q), torch.empty(2, 4, 100)

    def call(q, k, v, out, lse):
        assert rta.attention(q, k, v, True, 0.125, out=out, lse=lse) == (out, lse)

    args = _bound_vs_full(fake_gpu, rta._BOUND, call, inputs)
    assert [x[2:4] for x in args[13:] if isinstance(x, tuple)] == [((200, 256), (768, 1))] * 3


def test_attention_bound_allocates_the_outputs_of_the_full_path(fake_gpu):
    q, k, v = torch.randn(2, 100, 3, 4, 64).bfloat16().permute(2, 0, 3, 1, 4)
    o1, l1 = rta.attention(q, k, v, True, 0.125)  # full path
    o2, l2 = rta.attention(q, k, v, True, 0.125)  # bound
    assert fake_gpu[0] == "slow" and len(fake_gpu) == 2
    assert o1.shape == o2.shape == (2, 4, 100, 64) and o1.stride() == o2.stride() == (25600, 64, 256, 1)
    assert l1.shape == l2.shape == (2, 4, 100) and l1.stride() == l2.stride() and l2.dtype == torch.float32


def test_attention_bound_output_takes_vs_head_dim(fake_gpu):
    """q/k of head dim 192, v of 128 (MLA prefill): a repeated call allocates the output the full path does."""
    q, k = (torch.randn(2, 4, 100, 192).bfloat16() for _ in range(2))
    v = torch.randn(2, 4, 100, 128).bfloat16()
    o1, _ = rta.attention(q, k, v, True, 0.125)  # full path
    o2, _ = rta.attention(q, k, v, True, 0.125)  # bound
    assert fake_gpu[0] == "slow" and len(fake_gpu) == 2
    assert o1.shape == o2.shape == (2, 4, 100, 128) and o1.stride() == o2.stride()


def test_attention_with_copies_is_not_bound(fake_gpu):
    q = torch.randn(1, 2, 64, 64).bfloat16()
    k_d_strided = torch.randn(1, 2, 64, 64).bfloat16().transpose(2, 3).contiguous().transpose(2, 3)
    rta.attention(q, k_d_strided, q, False, 0.125)
    assert not rta._BOUND  # k is copied: the copy must be made on every call
    rta.attention(q, q, q, False, 0.125)
    assert len(rta._BOUND) == 1


def test_gemm_bound_allocates_the_output_of_the_full_path(fake_gpu):
    a, b = torch.randn(256, 64).bfloat16(), torch.randn(64, 96).bfloat16()
    c1 = rtg.gemm(a, b, None, torch.float32)  # full path
    c2 = rtg.gemm(a, b, None, torch.float32)  # bound
    assert len(fake_gpu) == 2 and c1.shape == c2.shape == (256, 96) and c2.is_contiguous()
    assert c2.dtype == torch.float32 and c2.data_ptr() in [x[1] for x in fake_gpu[1][13:] if isinstance(x, tuple)]


def test_misaligned_address_takes_the_full_path(fake_gpu):
    b = torch.randn(64, 128).bfloat16()
    rtg.gemm(torch.randn(128, 64).bfloat16(), b, None, torch.bfloat16)
    base = torch.randn(128 * 64 + 8).bfloat16()
    a = base[1:1 + 128 * 64].view(128, 64)  # same shape and strides, 2 bytes off 16-byte alignment
    with pytest.raises(Unsupported, match="16-byte aligned"):
        rtg.gemm(a, b, None, torch.bfloat16)
    assert fake_gpu == ["slow"]  # nothing launched for it


def test_misaligned_out_is_a_reason(fake_gpu):
    # a caller's out= that TMA cannot store to: the reason names it (gemm_into logs it and falls back)
    a, b = torch.randn(128, 64).bfloat16(), torch.randn(64, 128).bfloat16()
    out = torch.empty(128 * 128 + 8).bfloat16()[1:1 + 128 * 128].view(128, 128)
    with pytest.raises(Unsupported, match="out is not 16-byte aligned"):
        rtg.gemm(a, b, None, torch.bfloat16, out=out)
    assert fake_gpu == []  # nothing launched


def test_launch_hook_takes_the_kernel_grid_path(fake_gpu):
    a, b = torch.randn(128, 64).bfloat16(), torch.randn(64, 128).bfloat16()
    rtg.gemm(a, b, None, torch.bfloat16)
    knobs.runtime.launch_enter_hook.add(hook := (lambda *args: None))
    try:
        rtg.gemm(a, b, None, torch.bfloat16)
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    assert fake_gpu == ["slow", "slow"]  # a profiler's hook sees every launch


def _kernel_args(flat: tuple) -> list:
    """The kernel's own arguments from the C launcher's (after the 13 fixed ones): a descriptor (its map, shape
    and strides) as ("map", address, shape, strides), other arguments as they are."""
    out, i = [], 0
    while i < len(flat):
        x = flat[i]
        if isinstance(x, tuple) and x[0] == "map":
            out.append(x[:4])
            i += 1 + len(x[2]) + len(x[3])
        else:
            out.append(x)
            i += 1
    return out


def test_gemm_launch_arguments_by_position(fake_gpu):
    """Every argument the GEMM kernel gets, in templates.gemm's order (a, b, c, bias, M, N, K)."""
    a, b, bias, out = (torch.randn(256, 64).bfloat16(), torch.randn(96, 64).bfloat16().t(), torch.randn(96).bfloat16(),
                       torch.empty(256, 96).bfloat16())
    rtg.gemm(a, b, bias, torch.bfloat16, out=out)
    rtg.gemm(a, b, bias, torch.bfloat16, out=out)  # bound: the C launcher sees the arguments
    assert _kernel_args(fake_gpu[1][13:]) == [
        ("map", a.data_ptr(), (256, 64), (64, 1)), ("map", b.data_ptr(), (96, 64), (64, 1)),
        ("map", out.data_ptr(), (256, 96), (96, 1)), bias.data_ptr(), 256, 96, 64]


def test_attention_launch_arguments_by_position(fake_gpu):
    """Every argument the attention kernel gets, in templates.attention's order: a reorder of the scalars there
    or in the runtime would pass the wrong value silently, so each is pinned (with values that differ)."""
    q = torch.randn(2, 6, 100, 64).bfloat16()                                  # [B, H, S, D]
    k, v = torch.randn(2, 120, 2, 2, 64).bfloat16().permute(2, 0, 3, 1, 4)    # from a fused KV projection, GQA
    out, lse = torch.empty(2, 100, 6, 64).bfloat16().transpose(1, 2), torch.empty(2, 6, 100)  # o as [B, S, H, D]
    rta.attention(q, k, v, False, 0.125, out=out, lse=lse)
    rta.attention(q, k, v, False, 0.125, out=out, lse=lse)
    kv = ((240, 128), (256, 1))
    assert _kernel_args(fake_gpu[1][13:]) == [
        ("map", q.data_ptr(), (1200, 64), (64, 1)), ("map", k.data_ptr(), *kv), ("map", v.data_ptr(), *kv),
        out.data_ptr(), lse.data_ptr(),
        100, 120, 6, 2, 3, 0.125 * rta.LOG2E,  # Sq, Skv, Hq, Hkv, G, qk_scale
        600, 100, 0,                           # q (rb, rh, ch): [B, H, S, D] rows
        120, 0, 64,                            # k and v: [B, S, H, D] rows
        100, 0, 64,                            # o: [B, S, H, D] rows
        12]                                    # BH


def test_the_choice_sends_a_call_to_the_vendor_and_remembers_it(fake_gpu, monkeypatch):
    """Where runtime.choice picks the vendor (here the prior, for M=16), the runtime returns None without
    launching, remembers that per shape, and the public op runs cuBLAS's path and counts it as "vendor"."""
    from torch_autows import config, ops
    from torch_autows.runtime import fallback

    monkeypatch.setattr(config, "choice", "prior")
    fallback.reset()
    a, b = torch.randn(16, 64).bfloat16(), torch.randn(64, 96).bfloat16()
    assert rtg.gemm(a, b, None, torch.bfloat16) is None and fake_gpu == []  # nothing launched
    assert rtg.VENDOR in rtg._BOUND.values()
    out = ops.gemm(a, b)
    torch.testing.assert_close(out, torch.mm(a, b))
    assert fallback.counters["gemm.vendor"] == 1 and fallback.counters["gemm.autows"] == 0 and fake_gpu == []
    monkeypatch.setattr(config, "choice", "autows")  # the same call, forced: our kernel launches
    assert rtg.gemm(a, b, None, torch.bfloat16) is not None and fake_gpu == ["slow"]


@pytest.fixture
def cpu_scratch(monkeypatch):
    """runtime.scratch on CPU: one (workspace, counters) pair, grown as asked; the sizes asked are recorded."""
    from torch_autows.runtime import scratch

    asked, pair = [], {}

    def get(idx, ws_elems, tiles):
        asked.append((ws_elems, tiles))
        if not pair or pair["ws"].numel() < ws_elems or pair["locks"].numel() < tiles:
            pair.update(ws=torch.empty(ws_elems), locks=torch.zeros(tiles, dtype=torch.int32))
        return pair["ws"], pair["locks"]

    monkeypatch.setattr(scratch, "get", get)
    return asked, pair


def test_split_k_gemm_launch_arguments_and_grid(fake_gpu, cpu_scratch):
    """A split-K config gets the workspace and counters after the scalars, and S CTAs per output tile."""
    asked, pair = cpu_scratch
    a, b, out = torch.randn(5, 1024).bfloat16(), torch.randn(1024, 256).bfloat16(), torch.empty(5, 256).bfloat16()
    o = rtg.CONFIGS["dec_128x128_s4"]
    rtg.gemm(a, b, None, torch.bfloat16, config="dec_128x128_s4", out=out)
    rtg.gemm(a, b, None, torch.bfloat16, config="dec_128x128_s4", out=out)  # bound
    tiles = 1 * (256 // o.block_n)
    assert asked == [(4 * tiles * o.block_m * o.block_n, tiles)] * 2  # the bound call asks for this stream's pair
    assert fake_gpu[1][0] == tiles * 4  # grid: every part of every tile (fewer than the SMs)
    assert _kernel_args(fake_gpu[1][13:]) == [
        ("map", a.data_ptr(), (5, 1024), (1024, 1)), ("map", b.data_ptr(), (1024, 256), (256, 1)),
        ("map", out.data_ptr(), (5, 256), (256, 1)), 5, 256, 1024, pair["ws"].data_ptr(), pair["locks"].data_ptr()]


def test_swiglu_launch_arguments(fake_gpu, cpu_scratch):
    """The SwiGLU kernel gets a, both weights (nn.Linear's transposed views, read as [N, K]), c, the scalars,
    and a workspace slot per accumulator (2) and part."""
    from torch_autows.runtime import swiglu as rts

    rts._BOUND.clear()
    asked, pair = cpu_scratch
    a = torch.randn(3, 512).bfloat16()
    wg, wu = torch.randn(384, 512).bfloat16(), torch.randn(384, 512).bfloat16()
    out = torch.empty(3, 384).bfloat16()
    name = "swiglu_dec_64x128_s2"
    o = rts.CONFIGS[name]
    rts.gemm_swiglu(a, wg.t(), wu.t(), torch.bfloat16, config=name, out=out)
    rts.gemm_swiglu(a, wg.t(), wu.t(), torch.bfloat16, config=name, out=out)  # bound
    tiles = -(-384 // o.block_n)
    assert asked[-1] == (2 * 2 * tiles * o.block_m * o.block_n, tiles)
    assert _kernel_args(fake_gpu[1][13:]) == [
        ("map", a.data_ptr(), (3, 512), (512, 1)), ("map", wg.data_ptr(), (384, 512), (512, 1)),
        ("map", wu.data_ptr(), (384, 512), (512, 1)), ("map", out.data_ptr(), (3, 384), (384, 1)),
        3, 384, 512, pair["ws"].data_ptr(), pair["locks"].data_ptr()]
    rts._BOUND.clear()
