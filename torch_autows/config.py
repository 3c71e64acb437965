"""The package's settings, in one place. Each reads an environment variable TORCH_AUTOWS_<NAME> at import.

Environment values are parsed strictly. A boolean accepts exactly 1/0, true/false, yes/no, on/off
(case-insensitive, surrounding whitespace ignored); any other value, the empty string included, makes
``import torch_autows`` raise a ValueError that names the variable, the value and the accepted spellings.
We raise rather than fall back to the default: a misspelled "off" (``TORCH_AUTOWS_GEMM=disabled``) would
otherwise run the opposite of what was asked, silently. A directory variable set to blanks only is unset.
An unknown ``TORCH_AUTOWS_*`` name (a typo such as ``TORCH_AUTOWS_GEMMS``) gives one warning at import
that names the closest known variable.

Change settings at run time with plain assignment (``torch_autows.config.debug = True``) or, scoped and
validated, with ``patch``::

    with torch_autows.config.patch(gemm=False, choice="prior"):
        ...

    @torch_autows.config.patch(debug=True)
    def test_something(): ...

``snapshot()`` returns the settings that change what is compiled as a dict, which the Inductor
integration hashes into its cache key.
"""
from __future__ import annotations

import contextlib
import difflib
import os
import sys
import warnings

PREFIX = "TORCH_AUTOWS"
TRUE_SPELLINGS = ("1", "true", "yes", "on")
FALSE_SPELLINGS = ("0", "false", "no", "off")
CHOICES = ("measure", "prior", "autows", "vendor")
BACKWARD_CHOICES = ("vendor", "autows", "measure")

#: Every environment variable the package reads; any other TORCH_AUTOWS_* name is warned about at import.
#: TORCH_AUTOWS is the enable switch (``torch_autows/__init__.py``); REFERENCE is read by the benchmarks,
#: TEST_SHARD by the GPU tests.
ENV_VARS = frozenset({PREFIX} | {f"{PREFIX}_{n}" for n in (
    "DUMP", "DEBUG", "GEMM", "ATTENTION", "ATTENTION_BACKWARD", "CACHE_DIR", "CHOICE", "REFERENCE", "TEST_SHARD")})


def parse_bool(name: str, value: str) -> bool:
    """``value`` of environment variable ``name`` as a bool; ValueError naming both unless it is one of
    1/0, true/false, yes/no, on/off (case-insensitive, surrounding whitespace ignored)."""
    s = value.strip().lower()
    if s in TRUE_SPELLINGS:
        return True
    if s in FALSE_SPELLINGS:
        return False
    raise ValueError(f"{name}={value!r} is not a boolean; use one of 1/0, true/false, yes/no, on/off "
                     f"(case-insensitive), or unset {name} for its default")


def env_flag(name: str, default: bool, environ=None) -> bool:
    """The boolean environment variable ``name`` (strict, see ``parse_bool``); ``default`` when unset."""
    v = (os.environ if environ is None else environ).get(name)
    return default if v is None else parse_bool(name, v)


def env_path(name: str, environ=None) -> str | None:
    """The directory named by environment variable ``name``; None when unset or blank."""
    v = (os.environ if environ is None else environ).get(name)
    return v if v is not None and v.strip() else None


def env_choice(name: str, default: str, choices: tuple[str, ...], environ=None) -> str:
    """The environment variable ``name``, one of ``choices`` (case-insensitive, whitespace ignored);
    ``default`` when unset; ValueError naming the variable, the value and the choices otherwise."""
    v = (os.environ if environ is None else environ).get(name)
    if v is None:
        return default
    s = v.strip().lower()
    if s not in choices:
        raise ValueError(f"{name}={v!r} is not one of {', '.join(choices)}; unset {name} for {default!r}")
    return s


def unknown_env_vars(environ=None) -> list[str]:
    """One message per ``TORCH_AUTOWS_*`` name in the environment that the package does not read, with
    the closest known name."""
    out = []
    for name in sorted(os.environ if environ is None else environ):
        if name.startswith(PREFIX + "_") and name not in ENV_VARS:
            # compare what follows the prefix: every name shares it, which would make anything look close
            known = {v[len(PREFIX) + 1:]: v for v in ENV_VARS if v != PREFIX}
            close = difflib.get_close_matches(name[len(PREFIX) + 1:], sorted(known), n=1, cutoff=0.6)
            hint = f"; did you mean {known[close[0]]}?" if close else f"; known: {', '.join(sorted(ENV_VARS))}"
            out.append(f"environment variable {name} is not read by torch_autows and has no effect{hint}")
    return out


#: Directory to write the IR after every pipeline step (TORCH_AUTOWS_DUMP=dir); None: no dump.
dump_dir: str | None = env_path(f"{PREFIX}_DUMP")
#: Run the IR verifier after every pass (always on in tests).
debug: bool = env_flag(f"{PREFIX}_DEBUG", False)
#: Serve GEMMs with generated kernels (ops.gemm / the Inductor choice). Off: always torch.
gemm: bool = env_flag(f"{PREFIX}_GEMM", True)
#: Serve attention with generated kernels. Off: always torch SDPA.
attention: bool = env_flag(f"{PREFIX}_ATTENTION", True)
#: Root directory for generated sources and compiled kernels on disk (TORCH_AUTOWS_CACHE_DIR); None: the
#: default root: TORCHINDUCTOR_CACHE_DIR's autows/ subfolder (Inductor's default /tmp/torchinductor_<user>).
cache_dir: str | None = env_path(f"{PREFIX}_CACHE_DIR")
#: How a site picks between the generated kernel and the vendor path (TORCH_AUTOWS_CHOICE): "measure" on
#: the GPU and cache the decision / "prior": a cost rule without measuring / "autows": always ours where
#: servable / "vendor": always the vendor's.
choice: str = env_choice(f"{PREFIX}_CHOICE", "measure", CHOICES)
#: Who computes the gradients of ``ops.attention`` (TORCH_AUTOWS_ATTENTION_BACKWARD): "vendor" (cuDNN, then torch's
#: flash kernel, then the math; attention_grad.py) / "autows": the generated backward (runtime/attention_bwd.py)
#: where it serves the call, else the vendor's, with the reason logged once / "measure" (default): the generated
#: backward where it serves the call and runtime.choice (``choice``'s mode: measured, cached, prior) finds it faster
#: than the vendor's; always it under torch.use_deterministic_algorithms (bit-reproducible where the vendor's is not).
attention_backward: str = env_choice(f"{PREFIX}_ATTENTION_BACKWARD", "measure", BACKWARD_CHOICES)

for _msg in unknown_env_vars():
    warnings.warn(_msg, UserWarning, stacklevel=2)


def _is_dir(v) -> bool:
    return v is None or isinstance(v, (str, os.PathLike))


#: name -> (validator, what it accepts); the settings ``patch`` may change.
_SETTINGS = {
    "dump_dir": (_is_dir, "a directory (str or os.PathLike) or None"),
    "debug": (lambda v: isinstance(v, bool), "a bool"),
    "gemm": (lambda v: isinstance(v, bool), "a bool"),
    "attention": (lambda v: isinstance(v, bool), "a bool"),
    "cache_dir": (_is_dir, "a directory (str or os.PathLike) or None"),
    "choice": (lambda v: v in CHOICES, f"one of {', '.join(map(repr, CHOICES))}"),
    "attention_backward": (lambda v: v in BACKWARD_CHOICES, f"one of {', '.join(map(repr, BACKWARD_CHOICES))}"),
}


class _Patch(contextlib.ContextDecorator):
    """Set settings on entry, restore the previous values on exit; also a decorator (a fresh entry per
    call). Names and values are checked when ``patch`` is called."""

    def __init__(self, changes: dict):
        for name, value in changes.items():
            if name not in _SETTINGS:
                close = difflib.get_close_matches(name, list(_SETTINGS), n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                raise AttributeError(f"torch_autows.config has no setting {name!r}; {hint}"
                                     f"settings: {', '.join(_SETTINGS)}")
            ok, what = _SETTINGS[name]
            if not ok(value):
                raise ValueError(f"torch_autows.config.{name} must be {what}, got {value!r}")
        self.changes = dict(changes)
        self._saved: list[dict] = []

    def __enter__(self):
        mod = sys.modules[__name__]
        self._saved.append({k: getattr(mod, k) for k in self.changes})
        for k, v in self.changes.items():
            setattr(mod, k, v)
        return self

    def __exit__(self, *exc):
        mod = sys.modules[__name__]
        for k, v in self._saved.pop().items():
            setattr(mod, k, v)
        return False


def patch(changes: dict | None = None, **kw) -> _Patch:
    """Temporarily change settings: ``with patch(gemm=False): ...`` or ``@patch(debug=True)`` on a
    function; ``patch({"gemm": False})`` also works. An unknown name raises AttributeError and a value
    of the wrong kind ValueError, at once; the previous values come back on exit, also after an error."""
    return _Patch({**(changes or {}), **kw})


def snapshot() -> dict:
    """The settings that change what is compiled, as a plain dict (for cache keys and reports)."""
    return {"gemm": gemm, "attention": attention, "debug": debug, "choice": choice,
            "attention_backward": attention_backward}
