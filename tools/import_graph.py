"""The package's internal import graph, read with `ast` from the generated modules (nothing is imported).

    python tools/import_graph.py                 # modules, edges, layers (longest import chain), largest module
    python tools/import_graph.py --chain         # ... and one longest chain, module by module
    python tools/import_graph.py --top-level     # only module-level imports (imports inside functions left out)

A module is every `pe_anchors/**/*.py` but `__init__.py` and the generated `_modidx.py`; an edge is a distinct
(importer, imported module) pair inside the package. A module's layer is 1 when it imports nothing of the package
and 1 + the highest layer it imports otherwise, so the number of layers is the longest import chain, in modules.
"""
import argparse, ast
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = 'pe_anchors'

def module_name(path: Path) -> str:
    "`pe_anchors/mech/sae.py` -> `pe_anchors.mech.sae`."
    return '.'.join(path.relative_to(ROOT).with_suffix('').parts)

def imported(node: ast.AST, mod: str) -> list[str]:
    "The absolute names an `import` / `from ... import` node in module `mod` refers to."
    if isinstance(node, ast.Import): return [a.name for a in node.names]
    if not isinstance(node, ast.ImportFrom): return []
    if node.level:                                   # relative: climb from the module's package
        base = mod.split('.')[:-node.level]
        stem = '.'.join(base + ([node.module] if node.module else []))
    else: stem = node.module or ''
    return [stem] + [f'{stem}.{a.name}' for a in node.names]     # `from . import x` names a module x

def graph(top_level: bool = False) -> tuple[dict[str, set[str]], dict[str, int]]:
    "Edges (module -> package modules it imports) and each module's length in lines."
    paths = [p for p in sorted((ROOT/PKG).rglob('*.py')) if p.name not in ('__init__.py', '_modidx.py')]
    mods = {module_name(p): p for p in paths}
    edges, lines = {}, {}
    for m, p in mods.items():
        src = p.read_text(encoding='utf-8')
        lines[m] = len(src.splitlines())
        tree = ast.parse(src)
        nodes = tree.body if top_level else ast.walk(tree)
        deps = set()
        for node in nodes:
            for name in imported(node, m):
                parts = name.split('.')                # the longest prefix that is a module of the package
                for k in range(len(parts), 0, -1):
                    if (cand := '.'.join(parts[:k])) in mods:
                        if cand != m: deps.add(cand)
                        break
        edges[m] = deps
    return edges, lines

def layers(edges: dict[str, set[str]]) -> dict[str, int]:
    "Each module's layer: 1 + the highest layer among what it imports (1 for a module importing nothing)."
    @cache
    def layer(m, stack=()):
        if m in stack: raise ValueError(f"import cycle: {' -> '.join(stack + (m,))}")
        return 1 + max((layer(d, stack + (m,)) for d in edges[m]), default=0)
    return {m: layer(m) for m in edges}

def longest_chain(edges: dict[str, set[str]], lay: dict[str, int]) -> list[str]:
    "One import chain of maximal length, from the top module down."
    m = max(lay, key=lambda k: (lay[k], k))
    chain = [m]
    while edges[m]:
        m = max(edges[m], key=lambda k: (lay[k], k)); chain.append(m)
    return chain

def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--chain', action='store_true', help='print one longest import chain')
    ap.add_argument('--top-level', action='store_true', help='count only module-level imports')
    a = ap.parse_args()
    edges, lines = graph(a.top_level)
    lay = layers(edges)
    big = max(lines, key=lines.get)
    print(f"modules {len(edges)}  edges {sum(map(len, edges.values()))}  layers {max(lay.values())}  "
          f"largest {big} ({lines[big]} lines)")
    over = sorted(((n, m) for m, n in lines.items() if n > 500), reverse=True)
    print("over 500 lines: " + (', '.join(f'{m.removeprefix(PKG + ".")} {n}' for n, m in over) or 'none'))
    if a.chain: print("longest chain: " + ' -> '.join(m.removeprefix(PKG + '.') for m in longest_chain(edges, lay)))

if __name__ == '__main__': main()
