"""Table, ratio, geomean, JSON, BENCHMARKS.md and plot, from recorded rows (no GPU)."""
from __future__ import annotations

import json
import math

import pytest

from torch_autows.bench import report, results
from torch_autows.bench.plot import plot_rows


def test_make_row_failed_row_has_no_time():
    row = results.make_row("gemm", "c", "autows", tflops=800.0, ms=0.1, rel_err=0.5, error="rel_err too big")
    assert row["tflops"] is None and row["ms"] is None and row["rel_err"] == 0.5
    assert list(row)[:7] == list(results.ROW_KEYS)
    assert results.make_row("gemm", "c", "x", rel_err=float("nan"))["rel_err"] is None


def test_summarize_ratios_and_failures(gemm_rows):
    s = {x["case"]: x for x in report.summarize(gemm_rows)}
    assert s["4096x4096x4096"]["best_other"] == "cublas"
    assert s["4096x4096x4096"]["ratio"] == pytest.approx(770 / 700)
    # a peer with an error is not the best other peer; the remaining best is
    assert s["8192x8192x8192"]["ratio"] == pytest.approx(684 / 760)
    assert s["bmm:32x2048x2048x128"]["status"] == "failed" and s["bmm:32x2048x2048x128"]["ratio"] is None
    assert s["addmm:8192x4096x4096"]["status"] == "failed"


def test_aggregate_geomean_min_counts_failures(gemm_rows):
    agg = report.aggregate(report.summarize(gemm_rows))
    assert agg["geomean"] == pytest.approx(math.sqrt((770 / 700) * (684 / 760)))
    assert agg["min"] == pytest.approx(684 / 760) and agg["min_case"] == "8192x8192x8192"
    assert (agg["n_ratios"], agg["n_cases"]) == (2, 4)
    assert agg["failed"] == ["bmm:32x2048x2048x128", "addmm:8192x4096x4096"]
    line = report.summary_line(agg)
    assert "geomean 0.995" in line and "min 0.900" in line and "over 2/4 cases" in line and "FAILED on 2" in line


def test_aggregate_without_any_ratio():
    rows = [results.make_row("gemm", "c", "autows", error="fell back to torch")]
    agg = report.aggregate(report.summarize(rows))
    assert agg["geomean"] is None and agg["failed"] == ["c"]
    assert "no ratio" in report.summary_line(agg)


def test_text_table(gemm_rows):
    text = report.table(gemm_rows)
    lines = text.splitlines()
    assert lines[0].split() == ["case", "cublas", "inductor-max-autotune", "triton-autows", "autows", "best", "other",
                                "autows/best"]
    row1 = next(line for line in lines if line.startswith("4096x4096x4096"))
    assert "700.0 ±2%" in row1 and "770.0 ±1%" in row1 and "1.100" in row1
    bmm = next(line for line in lines if line.startswith("bmm:"))
    assert bmm.split()[-1] == "FAIL" and bmm.split().count("-") == 2  # no inductor / triton rows
    assert "Failures:" in text and "bmm:32x2048x2048x128 / autows: fell back to torch" in text
    assert "ttg.warp_specialize absent" in text  # notes are shown


def test_markdown_table_escapes_pipes(gemm_rows):
    md = report.table(gemm_rows, markdown=True)
    assert md.splitlines()[0].startswith("| case | cublas |")
    assert "autotune \\| failed badly" in md


def test_split_table(model_rows):
    text = report.table(model_rows)
    assert "GPU time per forward by kernel class" in text
    row = next(line for line in text.splitlines() if line.strip().startswith("8x2048") and "eager" in line)
    assert row.split()[2:] == ["35.00", "2.50", "2.50", "88", "6", "6"]


def test_gpu_slug_and_result_path(tmp_path):
    assert results.gpu_slug("NVIDIA H200") == "h200"
    assert results.gpu_slug("NVIDIA H100 80GB HBM3") == "h100"
    assert results.gpu_slug(None) == "cpu"
    p1 = results.result_path(tmp_path, "2026-11-30", "NVIDIA H200", "gemm")
    assert p1.name == "2026-11-30-h200-gemm.json"
    results.write_json(p1, {"subcommand": "gemm"}, [])
    p2 = results.result_path(tmp_path, "2026-11-30", "NVIDIA H200", "gemm")
    assert p2.name == "2026-11-30-h200-gemm-2.json"
    results.write_json(p2, {}, [])
    assert results.result_path(tmp_path, "2026-11-30", "NVIDIA H200", "gemm").name == "2026-11-30-h200-gemm-3.json"


def test_json_roundtrip_rejects_nan(tmp_path, gemm_rows):
    path = results.write_json(tmp_path / "r.json", {"gpu": "NVIDIA H200"}, gemm_rows)
    data = results.load_json(path)
    assert data["rows"] == gemm_rows and data["meta"]["gpu"] == "NVIDIA H200"
    with pytest.raises(ValueError):
        results.write_json(tmp_path / "bad.json", {}, [{"tflops": float("nan")}])
    (tmp_path / "x.json").write_text(json.dumps({"no": "rows"}))
    with pytest.raises(ValueError):
        results.load_json(tmp_path / "x.json")


def test_error_text_is_one_truncated_line():
    t = results.error_text(RuntimeError("PassManager::run failed\n" + "x" * 2000))
    assert t.startswith("RuntimeError: PassManager::run failed x") and len(t) == results.ERROR_CHARS
    assert "\n" not in t


def _meta(work, ts, **kw):
    return {"subcommand": work, "date": ts[:10], "timestamp": ts, "gpu": "NVIDIA H200", "sm_count": 132,
            "torch": "2.11.0", "triton": "3.6.0", "git_commit": "abc123",
            "command": f"python -m torch_autows.bench {work}", "clocks": {"clocks.sm": "1980 MHz"}, **kw}


def test_benchmarks_md_newest_first_with_links(tmp_path, gemm_rows, model_rows):
    out = tmp_path / "bench" / "results"
    old = results.write_json(out / "2026-11-29-h200-gemm.json", _meta("gemm", "2026-11-29T10:00:00+00:00"),
                             gemm_rows[:4])
    new = results.write_json(out / "2026-11-30-h200-gemm.json", _meta("gemm", "2026-11-30T09:00:00+00:00"), gemm_rows)
    newer = results.write_json(out / "2026-11-30-h200-gemm-2.json",
                               _meta("gemm", "2026-11-30T11:00:00+00:00", complete=False), gemm_rows[4:8])
    results.write_json(out / "2026-11-30-h200-model.json", _meta("model", "2026-11-30T12:00:00+00:00"), model_rows)
    plot_rows(gemm_rows, new.with_suffix(".png"))
    (out / "junk.json").write_text("{not json")
    md_path = report.write_markdown(out, tmp_path / "BENCHMARKS.md")
    md = md_path.read_text()
    assert md.index("## gemm") < md.index("## model")
    pos = [md.index(f"### {p.stem}\n") for p in (newer, new, old)]
    assert pos == sorted(pos)
    assert ("NVIDIA H200 (132 SMs), nvidia-smi before the run: sm 1980 MHz; torch 2.11.0; triton 3.6.0; "
            "commit abc123") in md
    assert "**incomplete run**" in md
    assert "[plot](bench/results/2026-11-30-h200-gemm.png)" in md
    assert "[JSON](bench/results/2026-11-30-h200-gemm.json)" in md
    assert md.count("[plot](") == 1  # only files with a PNG get a plot link
    assert "geomean 0.995, min 0.900 (8192x8192x8192), over 2/4 cases" in md
    assert "GPU time per forward by kernel class" in md
    assert "`junk.json`: unreadable" in md
    assert "do not edit by hand" in md


def test_benchmarks_md_empty(tmp_path):
    md = report.render_markdown(tmp_path / "missing", tmp_path / "BENCHMARKS.md")
    assert "No results yet." in md


def test_plot_png(tmp_path, gemm_rows):
    path = plot_rows(gemm_rows, tmp_path / "p.png", title="gemm")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    assert plot_rows([], tmp_path / "none.png") is None


def test_benchmarks_md_opens_with_status_of_latest_runs(tmp_path, gemm_rows, model_rows):
    out = tmp_path / "bench" / "results"
    results.write_json(out / "2026-11-29-h200-gemm.json", _meta("gemm", "2026-11-29T10:00:00+00:00"), gemm_rows[:4])
    new = results.write_json(out / "2026-11-30-h200-gemm-2.json", _meta("gemm", "2026-11-30T09:00:00+00:00"),
                             gemm_rows)
    results.write_json(out / "2026-11-30-h200-model.json", _meta("model", "2026-11-30T12:00:00+00:00"), model_rows)
    plot_rows(gemm_rows, new.with_suffix(".png"))
    md = report.render_markdown(out, tmp_path / "BENCHMARKS.md")
    status = md[md.index("## Status"):md.index("## gemm")]
    rows = [line for line in status.splitlines() if line.startswith("| gemm") or line.startswith("| model")]
    assert rows == [
        "| gemm | [2026-11-30-h200-gemm-2](#2026-11-30-h200-gemm-2) | NVIDIA H200 | 2/4 | 0.995 | "
        "0.900 (8192x8192x8192) | 2 |",
        "| model | [2026-11-30-h200-model](#2026-11-30-h200-model) | NVIDIA H200 | 0/1 | - | - | 1 |"]
    assert "![gemm: 2026-11-30-h200-gemm-2](bench/results/2026-11-30-h200-gemm-2.png)" in status
    assert "### 2026-11-30-h200-gemm-2\n" in md  # the anchor's target
    assert "shared/" not in md and "torch_autows/bench/README.md" in md


def test_repeated_failures_are_one_line(gemm_rows):
    rows = gemm_rows + [results.make_row("gemm", c, "triton-autows", error="output has NaN/Inf")
                        for c in ("a", "b", "c")]
    text = report.table(rows)
    assert "- triton-autows on 3 cases (a, b, c): output has NaN/Inf" in text
    assert text.count("output has NaN/Inf") == 1


def test_attention_panels_by_head_dim_causal_gqa():
    from torch_autows.bench import cases
    from torch_autows.bench.plot import panels

    names = [c.name for c in cases.attention_cases()]
    got = panels("attention", names)
    assert [t for t, _, _ in got] == ["d64", "d64 causal", "d128", "d128 causal", "d128 GQA32/8",
                                      "d128 causal GQA32/8", "d96", "d96 causal", "d192", "d192 causal", "d256",
                                      "d256 causal", "d128 GQA64/8", "d128 causal GQA64/8", "d192v128",
                                      "d192v128 causal"]
    assert got[0][2] == ["512", "1k", "2k", "4k", "8k", "16k"] and sum(len(cs) for _, cs, _ in got) == len(names)
    many = panels("decode", [f"c{i}" for i in range(30)])
    assert len(many) == 3 and all(len(cs) == 10 for _, cs, _ in many)


def test_peer_colours_are_fixed():
    from torch_autows.bench.plot import color

    assert color("autows") == "#d62728" and color("cublas") != color("inductor-max-autotune")
    assert color("some-new-peer") == color("some-new-peer") and color("some-new-peer") != color("autows")


def test_plot_is_relative_to_best_peer_and_readable_size(tmp_path):
    from torch_autows.bench import cases
    from torch_autows.bench.plot import relative

    rows = [results.make_row("attention", c.name, impl, tflops=t)
            for c in cases.attention_cases() for impl, t in (("cudnn", 500.0), ("fa2", 400.0), ("flex", 300.0),
                                                             ("triton-autows", 350.0), ("autows", 520.0))]
    rel = relative(rows)
    assert rel[("s512-d64", "cudnn")] == 1.0 and rel[("s512-d64", "autows")] == pytest.approx(1.04)
    path = plot_rows(rows, tmp_path / "a.png", title="attention")
    import struct

    w, h = struct.unpack(">II", path.read_bytes()[16:24])  # PNG IHDR
    assert 800 < w < 2000 and h < 2200  # 16 panels: 6 rows of 3


def test_try_plot_without_matplotlib_is_one_note(tmp_path, gemm_rows, monkeypatch):
    import sys

    from torch_autows.bench.plot import regenerate_plots, try_plot

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    notes = []
    assert try_plot(gemm_rows, tmp_path / "p.png", note=notes.append) is None
    assert len(notes) == 1 and "plot skipped" in notes[0] and not (tmp_path / "p.png").exists()
    results.write_json(tmp_path / "r1.json", {}, gemm_rows)
    results.write_json(tmp_path / "r2.json", {}, gemm_rows)
    notes.clear()
    assert regenerate_plots(tmp_path, note=notes.append) == [] and len(notes) == 1


def test_rows_with_only_a_time_compare_by_time():
    """A run that records ms and no TFLOP/s (the 2-GPU distributed steps) is compared by time: 10 ms against
    12.5 ms is 1.25x, shown in ms."""
    rows = [results.make_row("distributed", "tp", "inductor", ms=12.5),
            results.make_row("distributed", "tp", "autows", ms=10.0),
            results.make_row("distributed", "fsdp", "inductor", ms=20.0),
            results.make_row("distributed", "fsdp", "autows", error="MISMATCH")]
    s = {x["case"]: x for x in report.summarize(rows)}
    assert s["tp"]["ratio"] == pytest.approx(1.25) and s["tp"]["best_other"] == "inductor"
    assert s["fsdp"]["status"] == "failed" and s["fsdp"]["ratio"] is None
    assert "10.000 ms" in report.table(rows) and "12.500 ms" in report.table(rows)


def test_the_config_each_case_ran_with_is_a_column():
    """The attention bench notes each case's config (``config <name>``): the table gives it a column of its own
    (issue 15's "which config was picked", per case) instead of repeating it as notes; other notes stay notes."""
    rows = [results.make_row("attention", c, "cudnn", tflops=500.0, ms=1.0) for c in ("s512-d64", "s1024-d96")]
    rows += [results.make_row("attention", "s512-d64", "autows", tflops=510.0, ms=1.0, note="config ws_a"),
             results.make_row("attention", "s1024-d96", "autows", tflops=490.0, ms=1.0, note="config ws_b")]
    md = report.table(rows, markdown=True)
    assert md.splitlines()[0] == "| case | cudnn | autows | best other | autows/best | config |"
    assert "| s512-d64 | 500.0 | 510.0 | cudnn | 1.020 | ws_a |" in md and "| ws_b |" in md
    assert "Notes:" not in md
    rows.append(results.make_row("attention", "s2048-d64", "autows", error="fell back", note="why: vendor"))
    text = report.table(rows)
    assert text.splitlines()[0].split()[-1] == "config" and "s2048-d64 / autows: why: vendor" in text
    assert "config" not in report.table(rows[:2]).splitlines()[0]  # no notes of configs: no column
