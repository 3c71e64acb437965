"""The package's import structure: no import circle at module level, every import goes to the same or a
lower layer (lazy, function-level imports included: they are dependencies too), no file over 500 lines.

The graph is read from the sources (``ast``), so the test imports nothing of the package and sees every
import, also those in functions that no test happens to call.
"""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "torch_autows"
MAX_LINES = 500

# Layers, low to high, by the first name under torch_autows ("__init__": the package's own __init__).
# A module imports from its own layer or a lower one only.
LAYERS = [
    ["_version", "_logging", "_compat", "config", "diskcache", "diagnostics"],  # settings, plumbing, counters
    ["ir"],                                     # the tile IR: records, analysis, text form, op table
    ["templates"],                              # the IR programs of GEMM and attention, before any pass
    ["passes", "verify"],                       # the pipeline and the invariants it checks between passes
    ["codegen", "interp"],                      # consumers of the lowered IR: Gluon source, the interpreter
    ["runtime"],                                # plan, compile, choose and launch per call; fallback counters
    ["ops", "custom_ops", "sdpa_fallback", "attention_grad"],  # the public kernels, torch.ops.autows.*, torch paths
    ["inductor"],                               # the TorchInductor glue
    ["bench", "__main__", "__init__"],          # entry points: benchmarks, the CLI, the package __init__
]

# Inside torch_autows.inductor, the same rule, low to high.
INDUCTOR_LAYERS = [
    ["masks", "support", "externs", "attention_nodes"],  # mask analysis; "can autows serve this?"; the extern
                                                # kernels; the attention matcher's node predicates (and val)
    ["lowering", "attention_sites", "rewrite_attention", "rope_sites"],  # the ops' lowerings; the attention sites
                                                # and their rewrite (Dynamo graph); RoPE sites (post-grad, matching)
    ["rewrite_gemm"],                           # the post-grad GEMM rewrite (uses the lowerings, val())
    ["rewrite_swiglu", "rewrite_swiglu_bwd", "rewrite_residual", "rewrite_activation", "rewrite_rope"],
                                                # post-grad SwiGLU (forward, backward), residual, GELU and RoPE
                                                # fusions
    ["graph_passes"],                           # the CustomGraphPass objects and their cache key
    ["choices"],                                # the GEMM choices handler (acts while graph_passes are installed)
    ["backend", "explain"],                     # the torch.compile backend; the per-site report
    ["api", "__init__"],                        # enable() / disable() / inductor_options() / explain()
]

# Upward imports that are deliberate: (importer, imported, why). Keep it short.
EXCEPTIONS = [
    ("torch_autows.inductor.graph_passes", "torch_autows.inductor.choices",
     "the post-grad pass installs the choices handler in the compiling thread (lazily, at run of the pass)"),
]


def _modules() -> dict[str, Path]:
    out = {}
    for p in sorted(PACKAGE.rglob("*.py")):
        parts = ["torch_autows", *p.relative_to(PACKAGE).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = p
    return out


def _known(name: str, mods) -> str | None:
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def import_edges() -> list[tuple[str, str, bool, int]]:
    """(importer, imported, at module level, line) for every import of a torch_autows module."""
    mods, edges = _modules(), []
    for name, path in mods.items():
        is_pkg = path.name == "__init__.py"

        def visit(node, top, name=name, is_pkg=is_pkg):
            for child in ast.iter_child_nodes(node):
                here = top and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                targets = []
                if isinstance(child, ast.Import):
                    targets = [_known(a.name, mods) for a in child.names]
                elif isinstance(child, ast.ImportFrom):
                    base = child.module or ""
                    if child.level:
                        pkg = name.split(".") if is_pkg else name.split(".")[:-1]
                        base = ".".join(pkg[:len(pkg) - child.level + 1] + ([child.module] if child.module else []))
                    targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else _known(base, mods)
                               for a in child.names]
                edges.extend((name, t, here, child.lineno) for t in targets if t)
                visit(child, here)

        visit(ast.parse(path.read_text(), str(path)), True)
    return edges


def _layer(module: str, layers, package: str) -> int | None:
    """The index in ``layers`` of the module's first name under ``package`` ("__init__": the package's own)."""
    if module == package:
        key = "__init__"
    elif module.startswith(package + "."):
        key = module[len(package) + 1:].split(".")[0]
    else:
        return None
    for i, names in enumerate(layers):
        if key in names:
            return i
    return None


def _upward(layers, prefix: str) -> list[str]:
    allowed = {(a, b) for a, b, _ in EXCEPTIONS}
    bad = []
    for a, b, _, line in import_edges():
        la, lb = _layer(a, layers, prefix), _layer(b, layers, prefix)
        if la is not None and lb is not None and lb > la and (a, b) not in allowed:
            bad.append(f"{a}:{line} imports {b} (layer {lb} > {la})")
    return bad


def test_every_module_has_a_layer():
    mods = _modules()
    missing = [m for m in mods if _layer(m, LAYERS, "torch_autows") is None]
    assert not missing, f"add these to LAYERS in test/test_structure.py: {missing}"
    inductor = [m for m in mods if m.startswith("torch_autows.inductor")]
    missing = [m for m in inductor if _layer(m, INDUCTOR_LAYERS, "torch_autows.inductor") is None]
    assert not missing, f"add these to INDUCTOR_LAYERS in test/test_structure.py: {missing}"


def test_no_import_circle_at_module_level():
    graph: dict[str, set[str]] = {}
    for a, b, top, _ in import_edges():
        if top and a != b:
            graph.setdefault(a, set()).add(b)
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def dfs(m):
        state[m] = 1
        path.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                raise AssertionError("import circle: " + " -> ".join(path[path.index(n):] + [n]))
            if n not in state:
                dfs(n)
        path.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            dfs(m)


def test_no_import_from_a_higher_layer():
    bad = _upward(LAYERS, "torch_autows")
    assert not bad, "imports from a higher layer (move the code down, or the import up):\n" + "\n".join(bad)


def test_inductor_glue_is_layered():
    bad = _upward(INDUCTOR_LAYERS, "torch_autows.inductor")
    assert not bad, "inductor/: imports from a higher layer:\n" + "\n".join(bad)


def test_exceptions_are_lazy_and_real():
    edges = {(a, b): top for a, b, top, _ in import_edges()}
    for a, b, why in EXCEPTIONS:
        assert (a, b) in edges, f"stale exception {a} -> {b}: remove it from EXCEPTIONS"
        assert not edges[(a, b)], f"{a} -> {b} ({why}) must stay a function-level import"


def test_no_file_over_500_lines():
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"split these files (over {MAX_LINES} lines): {long}"


def test_the_graph_sees_lazy_and_relative_imports():
    edges = {(a, b, top) for a, b, top, _ in import_edges()}
    # a relative module-level import, and a lazy one inside a function (the package __init__'s backend)
    assert ("torch_autows.ops", "torch_autows.config", True) in edges
    assert ("torch_autows", "torch_autows.inductor.backend", False) in edges
