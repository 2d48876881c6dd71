"""No circle of imports between infra's modules: `python scripts/check_import_circles.py`
(scripts/test.sh lint). The layers themselves are import-linter's contracts (pyproject.toml
[tool.importlinter]); this names every group of modules that import each other, directly or
through others, with imports inside functions counted. The imports of the node agent's lazy
cloud lookup are left out (torchfleet_agent.cloud imports the chosen cloud's module inside a
function, and that module implements cloud's protocol): the one circle the layers allow. Exit 0:
no other circle; 1: each circle, its modules and their imports inside it."""

from __future__ import annotations

import sys

import grimp

PACKAGE = "infra"
AGENT = "infra.bootstrap.torchfleet_agent"
# (importer, imported): the imports left out of the graph, each a lookup done inside a function
ALLOWED = [(f"{AGENT}.cloud", f"{AGENT}.aws"), (f"{AGENT}.cloud", f"{AGENT}.alicloud")]


def circles(graph: grimp.ImportGraph) -> list[set[str]]:
    """The strongly connected groups of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append(
                        (child, iter(sorted(graph.find_modules_directly_imported_by(child))))
                    )
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.add(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(group)
    return found


def main() -> int:
    graph = grimp.build_graph(PACKAGE)
    for importer, imported in ALLOWED:
        if not graph.direct_import_exists(importer=importer, imported=imported):
            print(f"the allowed import {importer} -> {imported} is gone: drop it from ALLOWED")
            return 1
        graph.remove_import(importer=importer, imported=imported)
    bad = circles(graph)
    print(f"{len(graph.modules)} modules of {PACKAGE}: {len(bad)} circle(s) of imports")
    for group in bad:
        print(f"  a circle of {len(group)} modules:")
        for module in sorted(group):
            inside = sorted(graph.find_modules_directly_imported_by(module) & group)
            print(f"    {module} -> {', '.join(inside)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
