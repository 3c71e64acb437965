"""Benchmark harness: `python -m torch_autows.bench {gemm,attention,model,report}` (see shared/BENCH.md)."""
