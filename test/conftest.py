from __future__ import annotations

import pytest

from torch_autows import config


@pytest.fixture(autouse=True)
def _debug_verifier(monkeypatch):
    """Tests run the verifier after every pass."""
    monkeypatch.setattr(config, "debug", True)


@pytest.fixture(autouse=True)
def _generated_kernel_always(monkeypatch):
    """Tests check the generated kernels, so every servable call runs ours (``config.choice = "autows"``);
    the measured choice between ours and the vendor's (runtime.choice) has tests of its own that set it."""
    from torch_autows.runtime import choice

    monkeypatch.setattr(config, "choice", "autows", raising=False)
    choice.reset()
