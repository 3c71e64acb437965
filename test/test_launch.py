"""The direct launcher's decisions that can be checked without a GPU."""
from __future__ import annotations

import pytest
from triton import knobs

from torch_autows.runtime import launch


def test_empty_hook_chain_is_no_hook():
    # triton 3.6 always holds a HookChain: an empty one must not force the slow launch path
    assert not launch._hooks_installed()

    def hook(*a):
        return None

    knobs.runtime.launch_enter_hook.add(hook)
    try:
        assert launch._hooks_installed()
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    assert not launch._hooks_installed()


def test_direct_state_refuses_unknown_launchers():
    class Compiled:  # no C launcher in a closure: the slow path stays
        run = object()

    assert launch._direct_state(Compiled(), 3) is None


def test_direct_state_takes_a_launch_without_descriptors():
    """A kernel without descriptor arguments (a plain ``@triton.jit`` kernel: the attention backward's row kernels)
    has Triton's C launch function itself as ``launch`` (``wrap_handle_tensordesc`` wraps only kernels with
    descriptors): the direct state holds that function."""
    class Run:
        global_scratch_size = profile_scratch_size = 0
        launch_cooperative_grid = launch_pdl = False
        launch = len  # a builtin, as Triton's compiled C ``launch``: no __code__, no closure

    class Meta:
        tensordesc_meta = None

    class Compiled:
        run, function, packed_metadata, metadata = Run(), 7, (4, 1, 0), Meta()

    state = launch._direct_state(Compiled(), 0)
    assert state is not None and state[0] is len and state[1] == 7
    assert launch._direct_state(Compiled(), 1) is None  # a descriptor argument the state cannot encode


def test_specialization_follows_triton():
    assert launch._specialization(1) == ("constexpr", 1)
    assert launch._specialization(32)[1] == "D" and launch._specialization(33)[1] == ""


class _FakeCompiled:
    """What kernel[grid] returns, shaped like Triton 3.6's CompiledKernel/CudaLauncher."""

    def __init__(self, log):
        def raw(*args):
            log.append(("direct", args[0], args[13:]))

        def make(launcher):
            def inner(*args):
                return launcher(*args)
            return inner

        class Run:
            global_scratch_size = profile_scratch_size = 0
            launch_cooperative_grid = launch_pdl = False
            launch = make(raw)

        class Meta:
            tensordesc_meta = []

        self.run, self.function, self.packed_metadata, self.metadata = Run(), 7, (4, 1, 0), Meta()


def test_direct_path_per_specialization(monkeypatch):
    import torch

    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda i: 0, raising=False)
    log = []

    class Kernel:
        def __getitem__(self, grid):
            def run(*args, num_warps):
                log.append(("jit", grid[0], tuple(args)))
                return _FakeCompiled(log)
            return run

    L = launch.Launcher(Kernel(), [], 4)
    L(8, [64, 32], 0)   # first call of this key: compiled through kernel[grid]
    L(8, [128, 48], 0)  # same key (both divisible by 16): direct
    L(8, [17, 32], 0)   # 17: another specialisation, kernel[grid] again
    L(8, [1, 32], 0)    # 1 is a constant to Triton: another kernel
    L(8, [33, 64], 0)   # the key of 17: direct
    assert [e[0] for e in log] == ["jit", "direct", "jit", "jit", "direct"], log
    assert log[1][2] == (128, 48) and log[4][2] == (33, 64)


def test_ordered_binds_arguments_by_name():
    L = launch.Launcher(object(), [], 4, ("a", "M", "N"))
    assert L.ordered({"N": 3, "a": "t", "M": 2}) == ["t", 2, 3]


def test_ordered_names_missing_and_extra_arguments():
    L = launch.Launcher(object(), [], 4, ("a", "M", "N"))
    with pytest.raises(ValueError, match=r"missing \['N'\], extra \[\]"):
        L.ordered({"a": 1, "M": 2})
    with pytest.raises(ValueError, match=r"missing \['N'\], extra \['K'\]"):
        L.ordered({"a": 1, "M": 2, "K": 3})
    with pytest.raises(ValueError, match=r"missing \[\], extra \['K'\]"):
        L.ordered({"a": 1, "M": 2, "N": 3, "K": 4})


def test_compile_kernel_is_the_pipeline_once_per_key():
    from torch_autows.ir import format_program
    from torch_autows.passes import pipeline
    from torch_autows.runtime.gemm import CONFIGS
    from torch_autows.templates.gemm import GemmRequest, build

    req, opts = GemmRequest(1, 1, 1, bias=True), CONFIGS["ws_p_128x128"]
    k = launch.compile_kernel("gemm", req, opts)
    assert launch.compile_kernel("gemm", req, opts) is k
    trace = []
    pipeline.run(build(req, opts), trace=trace)
    assert [(n, format_program(p)) for n, p in k.trace] == [(n, format_program(p)) for n, p in trace]
    assert k.program is k.trace[-1][1]


def test_compile_kernel_names_a_wrong_template_or_request():
    from torch_autows.runtime.gemm import CONFIGS
    from torch_autows.templates.attention import AttentionRequest

    with pytest.raises(TypeError, match="template 'gemm' takes a GemmRequest"):
        launch.compile_kernel("gemm", AttentionRequest(64), CONFIGS["ws_p_128x128"])
    with pytest.raises(KeyError, match="unknown template 'conv'; the templates are gemm, attention"):
        launch.compile_kernel("conv", AttentionRequest(64), CONFIGS["ws_p_128x128"])


def test_first_compile_uses_inductors_triton_cache(monkeypatch):
    """A kernel's first compile goes to the Triton cache directory Inductor's kernels use (Inductor sets
    TRITON_CACHE_DIR on its first kernel, if unset), so a kernel compiled before Inductor's first one is found
    by the next process; a directory the user set is kept."""
    import os

    import torch
    from torch._inductor.runtime.cache_dir_utils import triton_cache_dir

    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda i: 0, raising=False)
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    seen = []

    class Kernel:
        def __getitem__(self, grid):
            def run(*args, num_warps):
                seen.append(os.environ.get("TRITON_CACHE_DIR"))
                return _FakeCompiled([])
            return run

    launch.Launcher(Kernel(), [], 4)(8, [64], 1)
    assert seen == [triton_cache_dir(1)]
    monkeypatch.setenv("TRITON_CACHE_DIR", "/somewhere/else")
    launch.Launcher(Kernel(), [], 4)(8, [64], 0)
    assert seen[-1] == "/somewhere/else"


def test_an_aliasing_argument_takes_its_alias_value_and_address():
    """An ``Arg.alias`` (the same tensor through a second TMA block shape: templates.attention's binary head-dim
    pieces) is given no value of its own: ``ordered`` passes its alias's ``Tma``, and a ``Bound`` launch takes one
    address per tensor, which the alias's descriptor slot shares."""
    import torch

    q, o = (launch.Tma(torch.empty(64, 192), (64, 192), (192, 1)) for _ in range(2))
    L = launch.Launcher(object(), [], 4, ("q", "o", "M", "q_w64"), {"q_w64": "q"})
    args = L.ordered({"q": q, "o": o, "M": 2})
    assert args == [q, o, 2, q] and args[3] is q
    assert L._srcs(args) == [0, 1, 0]
    assert launch.Launcher(object(), [], 4, ("q", "o", "M"))._srcs([q, o, 2]) is None

    launched = []
    state = (lambda *a: launched.append(a), 7, (4, 1, 0), False, False, [None] * 3)
    encode = {0: "map_q", 1: "map_o", 2: "map_q64"}
    bound = launch.Bound(state, 8, args, 0, lambda a, slot, meta: [encode[slot], *a.shape, *a.strides], L._srcs(args))
    addr_q, addr_o = q.tensor.data_ptr(), o.tensor.data_ptr()
    import unittest.mock as mock
    with mock.patch.object(torch._C, "_cuda_getCurrentRawStream", lambda i: 0, create=True), \
            mock.patch.object(launch, "_hooks_installed", lambda: False):
        assert bound(addr_q, addr_o)
    flat = launched[0][3 + 1 + 9:]  # after the grid (3), the stream and the C launcher's fixed arguments (9)
    desc = [64, 192, 192, 1]
    assert list(flat) == ["map_q", *desc, "map_o", *desc, 2, "map_q64", *desc]
