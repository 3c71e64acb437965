"""Benchmark harness: `python -m torch_autows.bench {gemm,attention,model,report}`.

Method, peers, shapes and correctness rules: torch_autows/bench/README.md.
"""
