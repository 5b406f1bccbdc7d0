"""Fails when hora's Python modules import each other in a cycle.

Every import counts, at module level or inside a function: a cycle that
only works because one side imports late still couples the two modules.
``from package import module`` is an edge to the module, not to the
package's ``__init__``. Run from the repository root (the style step does).
"""

import ast
import sys
from pathlib import Path


def modules(root):
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def edges(found):
    graph = {name: set() for name in found}
    for name, path in found.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parents = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(parents + ([base] if base else []))
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in found else base
                           for alias in node.names]
            graph[name].update(t for t in targets if t in found and t != name)
    return graph


def cycles(graph):
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, result = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                result.append(sorted(component))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return result


def main():
    graph = edges(modules(Path("python/hora")))
    found = cycles(graph)
    for component in found:
        print("import cycle:", file=sys.stderr)
        for name in component:
            print(f"  {name} imports {', '.join(sorted(graph[name] & set(component)))}",
                  file=sys.stderr)
    if found:
        return 1
    print(f"import cycles: none among {len(graph)} modules")
    return 0


if __name__ == "__main__":
    sys.exit(main())
