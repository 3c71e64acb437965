"""The main job: python -m torch_autows explain gemm ... --compile."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

import torch_autows
from torch_autows.__main__ import main
from torch_autows.ir import SM90


def test_explain_gemm_compile_prints_every_pass_gluon_and_summary(capsys):
    assert main(["explain", "gemm", "--m", "4096", "--n", "4096", "--k", "4096", "--dtype", "bf16", "--compile"]) == 0
    out = capsys.readouterr().out
    steps = ["template", "data_partition", "loop_schedule", "partition_schedule", "buffers", "memory_plan",
             "code_partition", "software_pipeline", "ping_pong", "tile_loop", "cross_tile"]
    pos = 0
    for s in steps + ["generated Gluon"]:
        pos = out.index(s, pos)
    last = out.strip().splitlines()[-1]
    assert last.startswith("summary: ")
    summary = json.loads(last[len("summary: "):])
    assert [p["name"] for p in summary["partitions"]] == ["consumer0", "consumer1", "producer"]
    assert summary["wgmma"] > 0 and summary["setmaxnreg"] > 0 and summary["spills"] == 0
    assert summary["smem_bytes"] <= SM90.smem_limit


def test_explain_attention_compile(capsys):
    argv = ["explain", "attention", "--b", "4", "--h", "16", "--s", "4096", "--d", "128", "--causal", "--compile"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "# ---- IR after software_pipeline ----" in out and "def producer(" in out
    summary = json.loads(out.strip().splitlines()[-1][len("summary: "):])
    assert len(summary["partitions"]) == 3 and summary["smem_bytes"] <= SM90.smem_limit


def test_explain_sass_counts_each_gluon_line(capsys):
    """--sass: the Gluon with each line's SASS instructions (compiled as launched, offline), every partition's total;
    the forward's epilogue normalises by a reciprocal a row (a multiply an element, no division per element)."""
    assert main(["explain", "attention", "--b", "32", "--s", "512", "--d", "128", "--gluon", "--sass"]) == 0
    out = capsys.readouterr().out
    section = out.split("# ---- SASS instructions per line (sm_90a, compiled as launched) ----\n")[1]
    rows = [line for line in section.splitlines() if line and not line.startswith("# totals")]
    counted = {r[8:].strip(): int(r[:6]) for r in rows if r[:6].strip()}
    assert counted["v_out_f_c0 = v_acc_f_c0 * v_rl_col_c0"] == 64  # one FMUL a register of the 64x128 tile
    assert not any("v_acc_f_c0 /" in text for text in counted)
    totals = section.split("# totals: ")[1].splitlines()[0]
    assert all(re.search(rf"\b{p} \d+", totals) for p in ("consumer0", "consumer1", "producer")), totals
    assert int(re.search(r"consumer0 (\d+)", totals).group(1)) > 1000  # the whole consumer, loop body once


def test_explain_attention_unsupported_head_dim():
    r = subprocess.run([sys.executable, "-m", "torch_autows", "explain", "attention", "--d", "80"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "head dim 80 not served" in r.stderr


def test_explain_attention_config_for_another_head_dim():
    r = subprocess.run([sys.executable, "-m", "torch_autows", "explain", "attention", "--d", "128", "--config",
                        "ws_p3_192x64_q2"], capture_output=True, text=True)
    assert r.returncode == 2 and "serves head dims (64,), not 128" in r.stderr


def test_explain_unknown_config():
    assert main(["explain", "gemm", "--m", "8", "--n", "8", "--k", "8", "--config", "nope"]) == 2


def test_explain_interpret_runs_both_semantics(capsys):
    assert main(["explain", "attention", "--d", "64", "--causal", "--interpret", "--seeds", "1"]) == 0
    out = capsys.readouterr().out
    assert "sequential (before partitioning)" in out and "partitioned adversarial" in out
    assert "no schedule violation" in out


# ---- usage errors: one line on stderr, exit status 2, no traceback ----

GEMM = ["explain", "gemm", "--m", "256", "--n", "256", "--k", "256"]
ATTN = ["explain", "attention", "--d", "64"]


@pytest.mark.parametrize("argv,msg", [
    (ATTN + ["--h", "16", "--hkv", "5"], "--hkv 5 must divide --h 16"),
    (ATTN + ["--h", "0"], "argument --h: must be >= 1, got 0"),
    (ATTN + ["--s", "-4"], "argument --s: must be >= 1, got -4"),
    (ATTN + ["--s", "0", "--compile"], "argument --s: must be >= 1, got 0"),
    (ATTN + ["--b", "-1"], "argument --b: must be >= 1, got -1"),
    (ATTN + ["--hkv", "0"], "argument --hkv: must be >= 1, got 0"),
    (ATTN + ["--skv", "0"], "argument --skv: must be >= 1, got 0"),
    (["explain", "attention", "--d", "0"], "argument --d: must be >= 1, got 0"),
    (["explain", "gemm", "--m", "0", "--n", "8", "--k", "8"], "argument --m: must be >= 1, got 0"),
    (["explain", "gemm", "--m", "-5", "--n", "8", "--k", "8"], "argument --m: must be >= 1, got -5"),
    (["explain", "gemm", "--m", "8", "--n", "8", "--k", "x"], "argument --k: expected a positive integer, got 'x'"),
    (GEMM + ["--batch", "0"], "argument --batch: must be >= 1, got 0"),
    (GEMM + ["--interpret", "--seeds", "0"], "argument --seeds: must be >= 1, got 0"),
    (ATTN + ["--interpret", "--seeds", "-1"], "argument --seeds: must be >= 1, got -1"),
    (GEMM + ["--stage", "nope"], "argument --stage: invalid choice: 'nope' (choose from 'template', "
                                 "'data_partition', 'loop_schedule', 'partition_schedule', 'buffers', "
                                 "'memory_plan', 'code_partition', 'software_pipeline', 'ping_pong', 'tile_loop', "
                                 "'cross_tile')"),
    (GEMM + ["--out", "somewhere"], "--out DIR needs --compile"),
    ([], "the following arguments are required: explain"),
])
def test_usage_errors(capsys, argv, msg):
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and msg in err and err.count("\n") == 1, err
    assert err.startswith("python -m torch_autows") and "--help" in err


def test_usage_error_as_a_process():
    r = subprocess.run([sys.executable, "-m", "torch_autows", "explain", "gemm", "--m", "0", "--n", "8", "--k", "8"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr and r.stderr.count("\n") == 1 and r.stdout == ""


# ---- help and version ----

def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.startswith(f"torch_autows {torch_autows.__version__} (torch")


def _help(capsys, argv) -> str:
    with pytest.raises(SystemExit) as e:
        main(argv + ["--help"])
    assert e.value.code == 0
    return " ".join(capsys.readouterr().out.split())  # argparse wraps lines


def test_help_texts(capsys):
    from torch_autows.__main__ import _parser
    from torch_autows.runtime import attention, gemm

    top = _help(capsys, [])
    assert "``" not in top and "python -m torch_autows explain gemm --m 4096" in top
    kinds = _parser()._subparsers._group_actions[0].choices["explain"]._subparsers._group_actions[0].choices
    for kind, p in kinds.items():
        for action in p._actions:
            assert action.help, f"{kind} {action.option_strings} has no help text"
    g = _help(capsys, ["explain", "gemm"])
    assert all(c in g for c in gemm.CONFIGS)
    a = _help(capsys, ["explain", "attention"])
    assert "head dim: 64, 96, 128, 192 or 256" in a and all(c in a for c in attention.CONFIGS)
    assert "ws_p3_192x64_q2 (d=64)" in a and "ws_p_128x64_rm_g16 (d=192/256)" in a and "code_partition" in a


# ---- what is printed ----

def _headers(out: str) -> list[str]:
    return [ln for ln in out.splitlines() if ln.startswith("# ---- ")]


STAGES = ["template", "data_partition", "loop_schedule", "partition_schedule", "buffers", "memory_plan",
          "code_partition", "software_pipeline", "ping_pong", "tile_loop", "cross_tile"]


@pytest.mark.parametrize("flags,expect", [
    ([], [f"IR after {s}" for s in STAGES] + ["generated Gluon"]),
    (["--ir", "--gluon"], [f"IR after {s}" for s in STAGES] + ["generated Gluon"]),
    (["--ir"], [f"IR after {s}" for s in STAGES]),
    (["--gluon"], ["generated Gluon"]),
    (["--stage", "memory_plan"], ["IR after memory_plan"]),
    (["--stage", "template", "--gluon"], ["IR after template", "generated Gluon"]),
])
def test_select_what_is_printed(capsys, flags, expect):
    assert main(GEMM + flags) == 0
    out = capsys.readouterr().out
    assert _headers(out) == [f"# ---- {e} ----" for e in expect]
    assert out.startswith("# request: GemmRequest(m=256")
    if expect == ["IR after memory_plan"]:
        assert "program gemm_" in out and "def producer(" not in out


def test_compile_summary_names_the_cubin_and_cache_key(capsys, tmp_path):
    assert main(GEMM + ["--gluon", "--compile"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1][len("summary: "):])
    assert re.fullmatch(r"[0-9a-f]{64}", summary["cache_key"])
    assert summary["cubin"].endswith(f"{summary['kernel']}.cubin") and os.path.isfile(summary["cubin"])
    with open(summary["cubin"], "rb") as f:
        cached = f.read()
    assert cached[:4] == b"\x7fELF"
    out_dir = tmp_path / "out"
    assert main(GEMM + ["--ir", "--stage", "template", "--compile", "--out", str(out_dir)]) == 0
    summary2 = json.loads(capsys.readouterr().out.strip().splitlines()[-1][len("summary: "):])
    assert summary2["cubin"] == str(out_dir / f"{summary['kernel']}.cubin")
    assert (out_dir / f"{summary['kernel']}.cubin").read_bytes() == cached
    assert summary2["cache_key"] == summary["cache_key"]


# ---- --interpret: the requested shape, or a said shrink ----

def _interp(capsys, argv) -> str:
    assert main(argv + ["--gluon", "--interpret", "--seeds", "1"]) == 0
    out = capsys.readouterr().out
    return out[out.index("# ---- CPU interpreter ----"):]


def test_interpret_runs_the_requested_small_gemm(capsys):
    out = _interp(capsys, ["explain", "gemm", "--m", "200", "--n", "72", "--k", "136", "--trans-b"])
    assert "note:" not in out and "instances: M=200 N=72 K=136 " in out and "1 seeds x 3 policies" in out


def test_interpret_shrinks_a_large_gemm_and_says_to_what(capsys):
    out = _interp(capsys, ["explain", "gemm", "--m", "4000", "--n", "1000", "--k", "1000"])
    note = next(ln for ln in out.splitlines() if ln.startswith("note: "))
    m = re.search(r"interpreting M=(\d+) N=(\d+) K=(\d+) instead of the requested M=4000 N=1000 K=1000", note)
    assert m and "budget" in note
    assert f"instances: M={m[1]} N={m[2]} K={m[3]} " in out
    assert int(m[1]) % 128 == 4000 % 128  # the last tile stays as ragged as asked


def test_interpret_batched_gemm(capsys):
    out = _interp(capsys, ["explain", "gemm", "--m", "100", "--n", "64", "--k", "100", "--batch", "3"])
    assert "program built for batch=2 instead of 3" in out and "whole 128x64 tiles" in out
    assert "instances: M=128 N=64 K=128 batch=2" in out


def test_interpret_attention_shapes(capsys):
    out = _interp(capsys, ATTN + ["--b", "1", "--h", "4", "--hkv", "2", "--s", "200", "--skv", "130", "--causal"])
    assert "note:" not in out and "instances: batch=1 Hq=4 Hkv=2 Sq=200 Skv=130 D=64 causal" in out
    out = _interp(capsys, ATTN + ["--b", "2", "--h", "32", "--hkv", "8", "--s", "1000"])
    assert "note: interpreting batch=1 Hq=4 Hkv=2 Sq=232 Skv=232 instead of the requested batch=2 Hq=32 " \
           "Hkv=8 Sq=1000 Skv=1000" in out
    assert "instances: batch=1 Hq=4 Hkv=2 Sq=232 Skv=232 D=64" in out


def test_explain_a_decode_gemm_shows_the_runtime_pick(capsys):
    # a few rows in nn.Linear's layout: the swap-AB pick, as runtime.gemm makes it; row-major b: a dec_* tile
    assert main(["explain", "gemm", "--m", "8", "--n", "4096", "--k", "4096", "--trans-b"]) == 0
    assert "# config: decs_64x128_m16_s1 (runtime heuristic: decs_64x128_m16_s1)" in capsys.readouterr().out
    assert main(["explain", "gemm", "--m", "8", "--n", "4096", "--k", "4096"]) == 0
    assert "# config: dec_" in capsys.readouterr().out


def test_explain_attention_backward_main_and_dq_kernels(capsys):
    """The backward's kernels in the runtime's form and configs: the main kernel (d=64 from 1024 keys: the reduce
    form, dQ added in it, up to 1024 keys by two CTAs an SM; below: the separate form), interpreted against torch's
    gradients;
    the separate form's dQ kernel at d=128 with 1024 keys (whole tiles: dQ by TMA; from 2048 keys the reduce form)."""
    from torch_autows.runtime import attention_bwd as rt

    assert main(["explain", "attention-bwd", "--d", "64", "--s", "200", "--h", "2", "--causal", "--stage",
                 "software_pipeline", "--interpret", "--seeds", "1"]) == 0
    out = capsys.readouterr().out
    assert f"# form: separate, the main kernel (dK, dV); config: {rt.choose_config(64, True, 'separate', 200)}" in out
    assert _headers(out) == ["# ---- IR after software_pipeline ----", "# ---- CPU interpreter ----"]
    assert "result: OK" in out
    assert main(["explain", "attention-bwd", "--d", "64", "--s", "200", "--h", "2", "--causal", "--dq-mode", "reduce",
                 "--stage", "software_pipeline", "--interpret", "--seeds", "1"]) == 0
    out = capsys.readouterr().out
    assert f"# form: reduce, the main kernel (dK, dV, dQ); config: {rt.choose_config(64, True, 'reduce', 200)}" in out
    assert "result: OK" in out
    assert main(["explain", "attention-bwd", "--d", "64", "--s", "1024", "--causal", "--stage", "loop_schedule"]) == 0
    assert "# form: reduce, the main kernel (dK, dV, dQ)" in capsys.readouterr().out
    assert main(["explain", "attention-bwd", "--d", "64", "--s", "1000", "--stage", "loop_schedule"]) == 0
    assert "# form: separate, the main kernel (dK, dV)" in capsys.readouterr().out  # reduce from 1024
    assert main(["explain", "attention-bwd", "--d", "128", "--s", "4096", "--kernel", "dq"]) == 2
    assert "the reduce form has no dQ kernel" in capsys.readouterr().err
    assert main(["explain", "attention-bwd", "--d", "128", "--s", "1024", "--stage", "loop_schedule"]) == 0
    assert "# form: reduce, the main kernel (dK, dV, dQ)" in capsys.readouterr().out  # whole KV tiles: from 1024
    assert main(["explain", "attention-bwd", "--d", "128", "--s", "512", "--kernel", "dq", "--gluon"]) == 0
    out = capsys.readouterr().out
    assert "AttentionBwdDqRequest(d=128, dtype='bf16', causal=False, dq_tma=True)" in out
    assert f"config: {rt.choose_dq_config(128, False)}" in out and "def consumer0(" in out


@pytest.mark.parametrize("argv,msg", [
    (["--d", "96"], "head dim 96 is not served by the generated backward"),
    (["--d", "128", "--dq-mode", "reduce", "--kernel", "dq"], "the reduce form has no dQ kernel"),
    (["--d", "64", "--config", "nope"], "attention backward config 'nope'"),
    (["--d", "64", "--kernel", "dq", "--dq-mode", "separate", "--dq-config", "nope"], "dQ config 'nope'"),
])
def test_explain_attention_backward_refuses_with_the_reason(capsys, argv, msg):
    assert main(["explain", "attention-bwd", *argv]) == 2
    assert msg in capsys.readouterr().err


def test_explain_compile_warns_when_ptxas_serializes_the_wgmma(capsys):
    """The atomic backward at d=128 (never a default form: out of registers for the wgmma pipeline) compiles with its
    wgmma serialized by ptxas; ``--compile`` says so on stderr and in the summary."""
    argv = ["explain", "attention-bwd", "--d", "128", "--s", "1024", "--dq-mode", "atomic", "--config",
            "bwd_64x128_dp2", "--compile"]
    assert main(argv) == 0
    cap = capsys.readouterr()
    assert "warning: ptxas serializes this kernel's wgmma due to insufficient register resources" in cap.err
    summary = json.loads(cap.out.strip().splitlines()[-1][len("summary: "):])
    assert summary["wgmma_serialized"] and summary["spills"] > 0


@pytest.mark.parametrize("epilogue,config", [("swiglu_bwd", "swiglu_bwd_p_128x256"),
                                             ("swiglu_save", "swiglu_p_128x128")])
def test_explain_gemm_with_a_training_epilogue(capsys, epilogue, config):
    """The SwiGLU training kernels through the CLI: their runtime's pick, the Gluon, the interpreter on the shape."""
    out = _interp(capsys, ["explain", "gemm", "--m", "200", "--n", "128", "--k", "136", "--epilogue", epilogue])
    assert "instances: M=200 N=128 K=136 " in out and "result: OK" in out
    assert main(["explain", "gemm", "--m", "200", "--n", "128", "--k", "136", "--epilogue", epilogue, "--gluon"]) == 0
    src = capsys.readouterr().out
    assert f"# config: {config} (runtime heuristic: {config})" in src
    assert ("tma.async_copy_shared_to_global(du_desc" if epilogue == "swiglu_bwd" else
            "tma.async_copy_shared_to_global(g_desc") in src
    assert main(["explain", "gemm", "--m", "200", "--n", "128", "--k", "136", "--epilogue", epilogue, "--bias"]) == 2
    assert "takes no bias" in capsys.readouterr().err
