"""Code generation: partitioned Program -> Gluon source (gluon.py) -> cubin (compile.py)."""
