"""TorchInductor integration of torch_autows.

    backend.py      the ``autows`` torch.compile backend (entry point ``torch_dynamo_backends``)
    ops.py          custom ops ``autows::attention`` / ``autows::gemm`` / ``autows::bmm`` (opaque to Inductor)
    lowering.py     the ops' Inductor lowerings: direct calls of our functions (no dispatcher per call)
    patterns.py     finds attention sites in the Dynamo (torch-level) graph and rewrites them to our op
    masks.py        which explicit mask tensors are provably causal (so the site can be served)
    gemm_pass.py    post-grad rewrite of aten.mm/addmm/bmm to our op (when max-autotune is off)
    choices.py      our GEMM as an ``ExternKernelChoice`` in Inductor's mm/addmm/bmm autotuning
    passes.py       the ``CustomGraphPass`` objects (cache-key uuid, chaining the user's passes)
    target.py       "can autows serve this?" checks shared by the rewrites, the choices and explain()
    api.py          enable() / disable() / inductor_options() / explain()
    explain.py      the per-site report ``explain()`` returns and prints

Importing this package is cheap; the modules above import ``torch._inductor`` themselves.
"""
from __future__ import annotations
