"""Import cycles among the modules of a package, from their import statements (ast; nothing is imported).

    python .ci/import_cycles.py [PACKAGE_DIR]      (default: cbo_jax)

Every ``import`` and ``from ... import`` is an edge, at module level or inside a function
(marked ``lazy``) or under ``if TYPE_CHECKING`` (marked ``typing``). ``from P import X``
points at ``P.X`` when that is a module, else at ``P``. Exit status 1 when a cycle exists.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path


def modules(root: Path) -> dict[str, Path]:
    out = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def edges(name: str, path: Path, known: set[str]) -> list[tuple[str, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    is_pkg = path.name == "__init__.py"
    found = []

    def visit(node, kind):
        for child in ast.iter_child_nodes(node):
            k = kind
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                k = "lazy" if kind == "top" else kind
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for sub in child.body:
                    visit_one(sub, "typing")
                    visit(sub, "typing")
                for sub in child.orelse:
                    visit_one(sub, k)
                    visit(sub, k)
                continue
            visit_one(child, k)
            visit(child, k)

    def visit_one(child, kind):
        if isinstance(child, ast.Import):
            for a in child.names:
                if a.name in known:
                    found.append((a.name, kind))
        elif isinstance(child, ast.ImportFrom):
            if child.level:
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[: len(base) - (child.level - 1)]
                mod = ".".join(base + ([child.module] if child.module else []))
            else:
                mod = child.module or ""
            for a in child.names:
                target = f"{mod}.{a.name}"
                if target in known:
                    found.append((target, kind))
                elif mod in known:
                    found.append((mod, kind))

    visit(tree, "top")
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), and self-loops."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]
    sys.setrecursionlimit(10000)

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
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
            if len(comp) > 1 or v in graph.get(v, ()):
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def main(argv: list[str]) -> int:
    root = Path(argv[1] if len(argv) > 1 else "cbo_jax").resolve()
    mods = modules(root)
    known = set(mods)
    kinds: dict[tuple[str, str], set[str]] = {}
    for name, path in mods.items():
        for target, kind in edges(name, path, known):
            if target != name:
                kinds.setdefault((name, target), set()).add(kind)
    # The parent package is imported before any of its modules: an edge to an ancestor is not a
    # cycle of its own unless that ancestor's __init__ imports back (then it shows as one).
    graph: dict[str, set[str]] = {}
    for (a, b), k in kinds.items():
        if "typing" in k and len(k) == 1:
            continue
        graph.setdefault(a, set()).add(b)
    found = cycles(graph)
    for comp in found:
        members = set(comp)
        print("cycle:", ", ".join(comp))
        for (a, b), k in sorted(kinds.items()):
            if a in members and b in members and not k <= {"typing"}:
                print(f"    {a} -> {b} ({'/'.join(sorted(k))})")
    if not found:
        print(f"no import cycle among the {len(mods)} modules of {root.name}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
