"""TorchInductor integration of torch_autows.

Modules, low to high (a module imports only from its own line or lower ones; test/test_structure.py):

    masks.py              which explicit mask tensors are provably causal (so the site can be served)
    support.py            "can autows serve this?" checks shared by the rewrites, the choices and explain()
    externs.py            ``extern_kernels.autows_{mm,addmm,bmm,mm_residual,attention}``, the kernels Inductor calls
    attention_nodes.py    one-node recognisers of the attention matcher (scaling, cast, mask, softmax); ``val``
    lowering.py           the ops' Inductor lowerings: direct calls of the extern kernels (no dispatcher per call)
    attention_sites.py    finds attention sites (SDPA, explicit chains) in the Dynamo (torch-level) graph
    rewrite_attention.py  rewrites the servable ones to our op
    rewrite_gemm.py       post-grad rewrite of aten.mm/addmm/bmm to our op (when max-autotune is off)
    rewrite_swiglu.py     post-grad fusion of a SwiGLU MLP's gate, up and silu-product into autows::gemm_swiglu
    rewrite_swiglu_bwd.py the backward's: the dh GEMM and the product's gradients into autows::gemm_swiglu_bwd
    graph_passes.py       the ``CustomGraphPass`` objects (cache-key uuid, chaining the user's passes)
    choices.py            our GEMM as an ``ExternKernelChoice`` in Inductor's mm/addmm/bmm autotuning
    backend.py            the ``autows`` torch.compile backend (entry point ``torch_dynamo_backends``)
    explain.py            the per-site report ``explain()`` returns and prints
    api.py                enable() / disable() / inductor_options() / explain()

The custom ops ``torch.ops.autows.{attention,gemm,bmm}`` (opaque to Inductor) are defined in
``torch_autows.custom_ops``, which ``import torch_autows`` loads before any module here; their backward
is ``torch_autows.attention_grad``.

Importing this package is cheap; the modules above import ``torch._inductor`` themselves.
"""
from __future__ import annotations
