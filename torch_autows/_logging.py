"""The ``torch_autows`` logger under torch's logging controls (``TORCH_LOGS``, ``torch._logging.set_logs``).

All of the package logs through ``logging.getLogger("torch_autows")``. These spellings turn it on:

- ``TORCH_LOGS=torch_autows`` (INFO), ``+torch_autows`` (DEBUG), ``-torch_autows`` (ERROR only): torch's
  module-name form. Works however the process starts.
- ``TORCH_LOGS=autows`` / ``+autows`` / ``-autows``: the short name. torch parses ``TORCH_LOGS`` inside
  ``import torch`` and rejects a name it does not know (the import fails), and torch has no hook that runs
  a third-party registration before that. So the short name works when ``torch_autows`` is imported
  before torch (``python -m torch_autows ...``, or ``import torch_autows`` first): at import, before it
  imports torch, this module rewrites the ``autows`` entries of ``os.environ["TORCH_LOGS"]`` to
  ``torch_autows`` (which torch, and the compile workers that inherit the environment, then parse). A
  program that imports torch first must use ``TORCH_LOGS=torch_autows``.
- ``torch._logging.set_logs(modules={"autows": logging.DEBUG})`` after ``import torch_autows``: the alias
  is registered with ``torch._logging._internal.register_log``.

Importing this module imports torch's logging package (which ``import torch`` loads anyway), never
torch._dynamo or torch._inductor.
"""
from __future__ import annotations

import os
import re

ALIAS = "autows"
LOGGER = "torch_autows"
_ENTRY = re.compile(r"(\s*)([+-]?)autows(\s*)")


def rewrite_torch_logs(environ=None) -> bool:
    """Rewrite the ``autows`` / ``+autows`` / ``-autows`` entries of TORCH_LOGS to ``torch_autows`` so that
    torch's import-time parser accepts them. Returns whether anything changed."""
    env = os.environ if environ is None else environ
    value = env.get("TORCH_LOGS")
    if not value:
        return False
    parts = value.split(",")
    new = [f"{m[1]}{m[2]}{LOGGER}{m[3]}" if (m := _ENTRY.fullmatch(p)) else p for p in parts]
    if new == parts:
        return False
    env["TORCH_LOGS"] = ",".join(new)
    return True


def register() -> None:
    """Register ``autows`` as torch's logging alias of the ``torch_autows`` logger (idempotent)."""
    from torch._logging import _internal

    if not _internal.log_registry.is_log(ALIAS):
        _internal.register_log(ALIAS, LOGGER)


rewrite_torch_logs()
register()
