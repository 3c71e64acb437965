"""The direct launcher's decisions that can be checked without a GPU."""
from __future__ import annotations

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
