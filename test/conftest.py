from __future__ import annotations

import pytest

from torch_autows import config


@pytest.fixture(autouse=True)
def _debug_verifier(monkeypatch):
    """Tests run the verifier after every pass."""
    monkeypatch.setattr(config, "debug", True)
