"""backend="autows" under DTensor tensor parallelism and FSDP2, on two gloo processes of this CPU.

Each test starts two ranks on 127.0.0.1 (a free port, ``GLOO_SOCKET_IFNAME=lo``) under a hard timeout that
kills them, so a stuck collective fails the test instead of hanging CI. The worker (``_worker.py``) runs
examples/distributed_llama.py's TP inference and FSDP2 training with the FX rewrites forced on
(``support._pretend_target``, as test/inductor/conftest.py's ``pretend``): attention and GEMM sites of the DTensor and
FSDP graphs become autows ops, which fall back to torch at run time on CPU tensors; the outputs, losses and
full gradients must still match a single-process eager model. The example itself runs under torchrun with
the plain backend. Skipped where torch.distributed or gloo is missing. About 2 minutes on two busy cores.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

pytestmark = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                reason="needs torch.distributed with the gloo backend")

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
WORLD = 2
TIMEOUT_S = 300  # per launch; a rank waiting on a dead peer is killed, not waited for
FP32_TOL = 1e-4


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(tmp_path: Path, **extra) -> dict:
    return {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "WORLD_SIZE": str(WORLD),
            "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT),
            "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"), **extra}


def _wait(procs: list[subprocess.Popen], logs: list[Path]) -> list[int]:
    try:
        return [p.wait(timeout=TIMEOUT_S) for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
            p.wait()
        tails = "\n".join(f"--- {log.name}\n{log.read_text()[-3000:]}" for log in logs)
        pytest.fail(f"the ranks did not finish in {TIMEOUT_S} s (killed)\n{tails}")


def launch(tmp_path: Path, modes: str, pretend: bool) -> list[dict]:
    """Run ``_worker.py`` on ``WORLD`` ranks; each rank's JSON result (a failing rank's traceback fails the test)."""
    env = _env(tmp_path)
    logs = [tmp_path / f"rank{r}.log" for r in range(WORLD)]
    procs = []
    for r in range(WORLD):
        with logs[r].open("w") as f:
            procs.append(subprocess.Popen([sys.executable, str(HERE / "_worker.py"), str(tmp_path), modes,
                                           str(int(pretend))], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                                          env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}))
    codes = _wait(procs, logs)
    results = []
    for r in range(WORLD):
        path = tmp_path / f"rank{r}.json"
        res = json.loads(path.read_text()) if path.exists() else {}
        if codes[r] != 0 or "traceback" in res or not res:
            pytest.fail(f"rank {r} exited {codes[r]}:\n{res.get('traceback') or logs[r].read_text()[-4000:]}")
        results.append(res)
    return results


def _assert_close(res: dict, mode: str, rank: int) -> None:
    errs = res[mode]["errors"]
    assert errs, f"rank {rank} {mode}: nothing compared"
    worst = max(errs, key=errs.get)
    assert errs[worst] <= FP32_TOL, f"rank {rank} {mode}: {worst} rel err {errs[worst]:.3e}\n{res[mode]}"


def test_rewrites_on_tp_fsdp_and_dtensor_graphs_match_eager(tmp_path):
    results = launch(tmp_path, "tp,fsdp,dtensor_attention", pretend=True)
    for rank, res in enumerate(results):
        for mode in ("tp", "fsdp", "dtensor_attention"):
            _assert_close(res, mode, rank)
        for mode in ("tp", "fsdp"):
            sites, calls = res[mode]["sites"], res[mode]["calls"]
            # the rewrites fired on the parallelised graphs, and the rewritten ops ran (falling back on CPU)
            assert sites.get("attention.rewritten", 0) >= 1 and sites.get("gemm.rewritten", 0) >= 1, (mode, sites)
            assert calls.get("attention.fallback", 0) >= 1 and calls.get("gemm.fallback", 0) >= 1, (mode, calls)
            assert not sites.get("attention.left") and not sites.get("gemm.left"), (mode, sites)
        # the FSDP backward went through autows's ops too: grads of every parameter were compared above
        assert res["fsdp"]["calls"].get("bmm.fallback", 0) + res["fsdp"]["calls"]["gemm.fallback"] > \
            res["tp"]["calls"]["gemm.fallback"], res["fsdp"]["calls"]
        # q, k, v as DTensors: autows::attention has no sharding strategy, so the site stays with torch, said why
        dt = res["dtensor_attention"]
        assert dt["sites"] == {"attention.left": 1}, dt
        assert any("DTensor" in r for r in dt["reasons"]), dt["reasons"]


def test_example_under_torchrun_on_cpu(tmp_path):
    # --mode tp only: its FSDP run is the worker's (above), and each mode costs ~30 s of compiling on two cores
    port = _free_port()
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={WORLD}", "--master-addr=127.0.0.1",
           f"--master-port={port}", str(ROOT / "examples" / "distributed_llama.py"), "--device", "cpu",
           "--mode", "tp", "--layers", "1", "--batch", "2", "--seq", "16", "--dim", "64", "--heads", "4",
           "--kv-heads", "2", "--ffn", "128"]
    env = {k: v for k, v in _env(tmp_path).items() if k not in ("MASTER_PORT", "WORLD_SIZE")}
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out = res.stdout
    assert "need sm_90 GPUs" in out and "nothing is timed" in out and "speedup" not in out, out
    assert "tp   ok on every rank" in out and "tp   output vs unsharded eager" in out and "MISMATCH" not in out, out
    assert "fsdp" not in out, out
