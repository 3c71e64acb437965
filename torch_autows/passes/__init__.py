"""The warp-specialization passes. Each module has ``run(program, options) -> Program``; pipeline.py
lists them in order. A pass raises ``PassError`` with a message saying what to change when a decision
point cannot be honoured (the runtime then tries another config or falls back)."""


class PassError(ValueError):
    """A decision point cannot be honoured for this Program; the message says what to change."""
