"""Result rows, run metadata and the JSON files of a results folder (default ``./bench/results``).

Nothing here writes into the installed package: results go to the folder the user names (``--out``),
by default ``bench/results`` under the current directory, which in a clone run from its root is the
recorded history the repository keeps.
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import re
import shlex
import subprocess
import sys
from pathlib import Path

#: The folder holding the ``torch_autows`` package: a clone's root, or site-packages when installed.
#: Only read from (git metadata, reference kernels), never written to.
REPO_ROOT = Path(__file__).resolve().parents[2]
#: Default results folder, relative to the current directory (resolved when used).
DEFAULT_OUT = Path("bench") / "results"
ERROR_CHARS = 400
ROW_KEYS = ("work", "case", "impl", "tflops", "ms", "rel_err", "error")


def make_row(work: str, case: str, impl: str, *, tflops=None, ms=None, rel_err=None, error=None, **extra) -> dict:
    """One result row; ``error`` set means failed, and then tflops/ms are None (never reported as a result)."""
    if error is not None:
        tflops = ms = None
    row = {"work": work, "case": case, "impl": impl, "tflops": _num(tflops), "ms": _num(ms),
           "rel_err": _num(rel_err), "error": error}
    row.update({k: v for k, v in extra.items() if v is not None})
    return row


def _num(x):
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def error_text(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    text = " ".join(text.split())  # one line; MLIR reproducers are long
    return text if len(text) <= ERROR_CHARS else text[: ERROR_CHARS - 3] + "..."


def gpu_slug(name: str | None) -> str:
    """'NVIDIA H200' -> 'h200'; 'NVIDIA H100 80GB HBM3' -> 'h100'; None -> 'cpu'."""
    if not name:
        return "cpu"
    words = re.findall(r"[a-z0-9]+", name.lower().replace("nvidia", " ").replace("geforce", " "))
    for w in words:
        if re.search(r"[a-z]", w) and re.search(r"\d", w):
            return w
    return "-".join(words) or "gpu"


def _run(cmd: list[str], timeout: float = 10.0) -> str | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO_ROOT)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_commit() -> str | None:
    """HEAD of the clone the package is imported from (None for an installed copy)."""
    top = _run(["git", "rev-parse", "--show-toplevel"])
    if not top or Path(top).resolve() != REPO_ROOT:  # site-packages inside some other checkout is not ours
        return None
    commit = _run(["git", "rev-parse", "HEAD"])
    if commit and _run(["git", "status", "--porcelain", "--untracked-files=no"]):
        commit += "+dirty"
    return commit


def nvidia_smi() -> dict | None:
    fields = "clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem,power.limit,driver_version"
    out = _run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"])
    if not out:
        return None
    vals = [v.strip() for v in out.splitlines()[0].split(",")]
    return dict(zip(fields.split(","), vals))


def collect_meta(subcommand: str, argv: list[str] | None = None, **extra) -> dict:
    import torch
    import triton

    now = _dt.datetime.now().astimezone()
    meta = {"subcommand": subcommand, "date": now.date().isoformat(), "timestamp": now.isoformat(timespec="seconds"),
            "command": "python -m torch_autows.bench " + shlex.join(sys.argv[1:] if argv is None else argv),
            "torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda,
            "git_commit": git_commit(), "gpu": None, "sm_count": None, "clocks": None}
    try:
        from torch_autows._version import __version__
        from torch_autows.inductor.graph_passes import source_hash

        meta["torch_autows"] = __version__
        # the package's content, exact even where the checkout's git metadata is stale (a copied tree)
        meta["source_sha256"] = source_hash()[:16]
    except ImportError:
        pass
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        meta.update(gpu=props.name, sm_count=props.multi_processor_count,
                    capability=f"{props.major}.{props.minor}", clocks=nvidia_smi())
        if torch.backends.cudnn.is_available():
            meta["cudnn"] = torch.backends.cudnn.version()
    meta.update(extra)
    return meta


def default_markdown(results_dir: Path) -> Path:
    """Where ``BENCHMARKS.md`` goes for a results folder: ``<root>/BENCHMARKS.md`` for ``<root>/bench/results``
    (a clone's layout), else next to the folder (``<parent>/BENCHMARKS.md``)."""
    results_dir = Path(results_dir).absolute()
    if results_dir.parts[-2:] == ("bench", "results"):
        return results_dir.parent.parent / "BENCHMARKS.md"
    return results_dir.parent / "BENCHMARKS.md"


def result_path(out_dir: Path, date: str, gpu: str | None, subcommand: str) -> Path:
    """``<out>/<date>-<gpu>-<subcommand>.json``; an existing name gets -2, -3, ... instead of being overwritten."""
    stem = f"{date}-{gpu_slug(gpu)}-{subcommand}"
    path = out_dir / f"{stem}.json"
    n = 2
    while path.exists():
        path = out_dir / f"{stem}-{n}.json"
        n += 1
    return path


def write_json(path: Path, meta: dict, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, allow_nan=False) + "\n")
    tmp.replace(path)
    return path


def load_json(path: Path) -> dict:
    data = json.loads(Path(path).read_text())
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        raise ValueError(f"{path}: not a benchmark result (no 'rows' list)")
    data.setdefault("meta", {})
    return data
