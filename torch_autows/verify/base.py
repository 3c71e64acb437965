"""The verifier's error, and how a check raises it (the stage, what is wrong, the op it is wrong at)."""
from __future__ import annotations

from ..ir import format_op


class VerifyError(AssertionError):
    pass


def _fail(stage: str, msg: str, o=None):
    where = f"\n  at: {format_op(o)[0].strip()}" if o is not None else ""
    raise VerifyError(f"[{stage}] {msg}{where}")
