"""The file-level import graph of tracekit: its circles and every import from a lower layer to a higher one.

    python benchmarks/import_graph.py [--edges]

Every ``import`` statement of every ``tracekit/**/*.py`` counts, those inside functions (lazy
imports) included: a circle that only closes at call time is still a circle for a reader. An
import names the file it loads (``from tracekit.a import b`` is ``tracekit/a/b.py`` when that
file or package exists, else ``tracekit/a/__init__.py``); the package ``__init__`` files Python
runs on the way are not counted.

The layers (README, "Architecture"), highest first; an import may point to its own layer or lower:

    5 faces     tracekit/__init__.py, __main__.py, api.py, cli/, collectors/
    4 report    report/, sqlshell.py
    3 analyses  analyses/;  ingest/ (beside analyses: neither imports the other)
    2 base      store/, model/, timeline/, progress.py
    1 ground    errors.py, vocab.py

Prints the circles (strongly connected groups of files; none allowed) and the imports that point
up a layer or sideways (report → ingest, analyses ↔ ingest; :data:`MAY_IMPORT`), each marked with its justification from
:data:`ALLOWED` (at most five, each named) or as UNJUSTIFIED. Exit status 1 when there is a
circle or an unjustified import. ``tests/test_layers.py`` runs the same checks.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tracekit"

LAYERS = (
    (5, "faces", ("tracekit", "tracekit.__main__", "tracekit.api", "tracekit.cli", "tracekit.collectors")),
    (4, "report", ("tracekit.report", "tracekit.sqlshell")),
    (3, "analyses", ("tracekit.analyses",)),
    (3, "ingest", ("tracekit.ingest",)),
    (2, "base", ("tracekit.store", "tracekit.model", "tracekit.timeline", "tracekit.progress")),
    (1, "ground", ("tracekit.errors", "tracekit.vocab")),
)
"""(rank, layer name, module prefixes); the longest matching prefix decides a module's layer
(``tracekit`` alone is the package face, tracekit/__init__.py)."""

ALLOWED: dict[tuple[str, str], str] = {}
"""(importing module, imported module) → why this import may point up a layer (at most five)."""

MAX_ALLOWED = 5


def module_of(path: Path) -> str:
    """``tracekit/a/b.py`` → ``tracekit.a.b``; ``tracekit/a/__init__.py`` → ``tracekit.a``."""
    return module_of_under(path, ROOT)


def module_of_under(path: Path, root: Path) -> str:
    """:func:`module_of` for a tree rooted at ``root``."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def files() -> dict[str, Path]:
    """Module name → file, for every ``.py`` under tracekit/, and the C extensions (their ``.c``
    source, or the built ``.so``: modules that import nothing of tracekit)."""
    out = {module_of(p): p for p in sorted(PACKAGE.rglob("*.py")) if "__pycache__" not in p.parts}
    for p in sorted([*PACKAGE.rglob("*.c"), *PACKAGE.rglob("*.so")]):
        name = p.name.split(".", 1)[0]
        out.setdefault(module_of(p.with_name(name + ".py")), p)
    return out


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    """The longest prefix of the dotted ``name`` that is a tracekit module file, or None."""
    parts = name.split(".")
    while parts:
        cand = ".".join(parts)
        if cand in known:
            return cand
        parts.pop()
    return None


def imports(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The tracekit modules ``path`` imports (absolute and relative, at any depth of the file):
    ``import a.b`` → the file of ``a.b``; ``from a import x`` → ``a.x`` when that is a module file,
    else the file of ``a``."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            names = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in known else mod for a in node.names]
        for n in names:
            if n == "tracekit" or n.startswith("tracekit."):
                got = _resolve(n, known)
                if got is not None and got != module:
                    out.add(got)
    return out


def graph() -> dict[str, set[str]]:
    """Module → the tracekit modules it imports."""
    known = files()
    return {m: imports(m, p, known) if p.suffix == ".py" else set() for m, p in known.items()}


def layer(module: str) -> tuple[int, str]:
    """(rank, layer name) of a module (:data:`LAYERS`)."""
    best = None
    for rank, name, prefixes in LAYERS:
        for pre in prefixes:
            if module == pre or (pre != "tracekit" and module.startswith(pre + ".")):
                if best is None or len(pre) > best[0]:
                    best = (len(pre), rank, name)
    if best is None:
        raise ValueError(f"{module}: in no layer of benchmarks/import_graph.py LAYERS")
    return best[1], best[2]


def circles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in sorted(g):
        if v not in index:
            visit(v)
    return sorted(out)


MAY_IMPORT = {
    "faces": {"faces", "report", "analyses", "ingest", "base", "ground"},
    "report": {"report", "analyses", "base", "ground"},
    "analyses": {"analyses", "base", "ground"},
    "ingest": {"ingest", "base", "ground"},
    "base": {"base", "ground"},
    "ground": {"ground"},
}
"""Layer → the layers its modules may import (the arrows of the module docstring)."""


def upward(g: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Imports :data:`MAY_IMPORT` does not allow (to a higher layer, or sideways: report → ingest,
    analyses ↔ ingest), sorted."""
    return sorted((src, dst) for src, dsts in g.items() for dst in dsts
                  if layer(dst)[1] not in MAY_IMPORT[layer(src)[1]])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    g = graph()
    n_edges = sum(len(v) for v in g.values())
    print(f"tracekit import graph: {len(g)} files, {n_edges} imports")
    if "--edges" in argv:
        for src in sorted(g):
            for dst in sorted(g[src]):
                print(f"  {src} -> {dst}")
    cs = circles(g)
    print(f"circles: {len(cs)}")
    for c in cs:
        print("  " + " <-> ".join(c))
    up = upward(g)
    print(f"imports from a lower layer to a higher one: {len(up)} (at most {MAX_ALLOWED}, each justified)")
    unjustified = 0
    for src, dst in up:
        why = ALLOWED.get((src, dst))
        if why is None:
            unjustified += 1
        print(f"  {src} ({layer(src)[1]}) -> {dst} ({layer(dst)[1]}): {why or 'UNJUSTIFIED'}")
    return 1 if cs or unjustified or len(up) > MAX_ALLOWED else 0


if __name__ == "__main__":
    sys.exit(main())
