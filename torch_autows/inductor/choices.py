"""Our GEMM as one more candidate in Inductor's mm / addmm / bmm autotuning (max-autotune).

``AutoWSChoices`` subclasses ``InductorChoices`` and overrides ``get_template_configs`` (same signature in
torch 2.11 and 2.13): after Inductor built its candidates (cuBLAS, Triton templates, ...), it appends an
``ExternKernelChoice`` that calls our generated kernel, when ``support.gemm_reason`` is None for the
shapes, dtypes and strides of the inputs (symbolic sizes: their hints; the kernel: externs.py). Inductor
then benchmarks all of them, so a shape goes to autows only where autows wins.

It only appends under max-autotune: without it, Inductor calls cuBLAS with no benchmark, and the
post-grad rewrite (rewrite_gemm.py) serves GEMMs instead. It only acts while autows's passes are in the
active Inductor config (``graph_passes.installed()``), so a handler left installed in a thread after
``disable()`` behaves exactly like ``InductorChoices``.

Installation: ``backend.autows`` sets it with ``V.set_choices_handler`` around each inner compile
(forward and the lazily compiled backward). ``enable()`` / ``inductor_options()`` cannot wrap the inner
compile, so ``AutoWSPostGradPass`` calls ``ensure_installed()``: post-grad passes run right before lowering,
in the thread that lowers. A user's own non-default choices handler is left alone (logged once).
"""
from __future__ import annotations

import logging
import threading

from torch._inductor.choices import InductorChoices
from torch._inductor.virtualized import V

from . import graph_passes, support
from .externs import extern_choice

log = logging.getLogger("torch_autows")


def _fake_inputs(kernel_inputs):
    shapes, strides = kernel_inputs.shapes_hinted(), kernel_inputs.strides_hinted()
    out = []
    for node, size, stride in zip(kernel_inputs.nodes(), shapes, strides):
        out.append(support.fake_tensor(size, stride, node.get_dtype(), node.get_device()))
    return out


def _request(kernel_inputs, templates, op_name):
    """(op, fake a, fake b, fake bias, bind kwargs) when this call should get our choice, else None."""
    uids = {t.uid for t in templates}
    if op_name in ("mm", "bmm"):
        if len(kernel_inputs.nodes()) != 2:
            return None
        a, b = _fake_inputs(kernel_inputs)
        return op_name, a, b, None, {}
    if op_name != "addmm":
        return None
    from torch._inductor.utils import use_aten_gemm_kernels

    # tuned_addmm asks several times; answer once: with the ATen call (it carries the un-expanded bias).
    if not ("aten::addmm" in uids or (not use_aten_gemm_kernels() and not any("contiguous" in u for u in uids))):
        return None
    alpha, beta = kernel_inputs.get_scalar("alpha"), kernel_inputs.get_scalar("beta")
    if alpha != 1 or beta != 1:
        return None
    inp, a, b = _fake_inputs(kernel_inputs)
    if inp.dim() == 2 and (inp.shape[0] == 1 or inp.stride(0) == 0):
        inp = inp[0]
    if inp.dim() != 1:
        return None
    return "addmm", a, b, inp, {"alpha": alpha, "beta": beta}


class AutoWSChoices(InductorChoices):
    """``InductorChoices`` plus our GEMM as an autotuning candidate while autows is on."""

    def uuid(self):  # needed when used as config.inductor_choices_class on 2.13
        return graph_passes.autows_uuid()

    def get_template_configs(self, kernel_inputs, templates, op_name, kwarg_overrides=None):
        choices = super().get_template_configs(kernel_inputs, templates, op_name, kwarg_overrides)
        if not (support.max_autotune_on() and graph_passes.installed()) or getattr(V.graph, "cpp_wrapper", False):
            return choices
        try:
            req = _request(kernel_inputs, templates, op_name)
        except Exception as e:  # never break Inductor's autotuning: log and carry on without us
            log.debug("autows: no GEMM choice for %s: %s", op_name, e)
            return choices
        if req is None:
            return choices
        op, a, b, bias, kw = req
        reason = support.gemm_reason(a, b, bias, kernel_inputs.out_dtype() if op != "addmm" else None)
        if reason is not None:
            support.note_site("gemm", reason)
            return choices
        layout = kernel_inputs.output_layout(flexible=False)
        choices.append(extern_choice(op).bind(kernel_inputs.nodes(), layout, **kw))
        support.site_counters["gemm.choice"] += 1
        return choices


_warned_foreign = False
_tls = threading.local()  # .prior: the handler ensure_installed replaced in this thread


def _current():
    from torch._inductor.virtualized import _choices

    return _choices._get_handler(False)


def ensure_installed() -> None:
    """Make this thread's choices handler an ``AutoWSChoices`` (enable()/options path); see the module doc."""
    global _warned_foreign
    current = _current()
    if isinstance(current, AutoWSChoices):
        return
    if type(current) is not InductorChoices:
        if not _warned_foreign:
            _warned_foreign = True
            log.warning("autows: a custom InductorChoices (%s) is installed; autows leaves it, so with "
                        "max-autotune its GEMM is not offered (the other rewrites still apply)", type(current).__name__)
        return
    _tls.prior = current
    V.set_choices_handler(AutoWSChoices())  # not a `with`: it stays for this thread (inert when autows is off)


def restore() -> None:
    """Put back the handler ``ensure_installed`` replaced in this thread (``disable()``)."""
    prior = getattr(_tls, "prior", None)
    if prior is not None and isinstance(_current(), AutoWSChoices):
        V.set_choices_handler(prior)
    _tls.prior = None
