"""Pages that explain, modules of one job: an exported cell is at most `CELL_LINES` lines (longer code is split into
functions that each get a sentence and an example on the page) and a generated module at most `MODULE_LINES` lines
(a longer one is split along its jobs, the old name kept as a façade). Both limits are ours: about one screen of
code per cell, and a module a reader can hold in mind."""
import json, re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CELL_LINES = 60
MODULE_LINES = 500
EXPORT = re.compile(r'^#\|\s*export', re.M)            # `#| export`, `#| exporti`, `#| export name`


def long_cells(nb: dict, limit: int = CELL_LINES) -> list[tuple[int, int]]:
    "(cell index, lines) of each exported code cell of notebook `nb` (parsed JSON) longer than `limit` lines."
    out = []
    for i, c in enumerate(nb['cells']):
        src = ''.join(c['source']) if isinstance(c['source'], list) else c['source']
        if c['cell_type'] == 'code' and EXPORT.search(src) and len(src.splitlines()) > limit:
            out.append((i, len(src.splitlines())))
    return out


def long_modules(pkg: Path, limit: int = MODULE_LINES) -> list[tuple[str, int]]:
    "(module path, lines) of each module of package folder `pkg` longer than `limit` lines (nbdev's index excepted)."
    return [(str(p.relative_to(pkg.parent)), n) for p in sorted(pkg.rglob('*.py'))
            if p.name != '_modidx.py' and (n := len(p.read_text().splitlines())) > limit]


def test_exported_cells_fit_on_a_screen():
    "No exported cell of a page is longer than CELL_LINES lines."
    bad = [f"  {nb.name} cell {i}: {n} lines" for nb in sorted((ROOT / 'nbs').glob('*.ipynb'))
           for i, n in long_cells(json.loads(nb.read_text()))]
    assert not bad, f"exported cells above {CELL_LINES} lines (split them into functions, each with a sentence and an example):\n" + '\n'.join(bad)


def test_modules_do_one_job():
    "No generated module is longer than MODULE_LINES lines."
    bad = [f"  {m}: {n} lines" for m, n in long_modules(ROOT / 'pe_anchors')]
    assert not bad, f"modules above {MODULE_LINES} lines (split along their jobs, the old module a façade):\n" + '\n'.join(bad)


def test_the_layout_checks_count_what_they_say(tmp_path):
    "Measured on a notebook and a package written here: only exported cells count, and the limit itself passes."
    def cell(src, kind='code'): return dict(cell_type=kind, source=src, metadata={})
    body = lambda n: '\n'.join(f'x{i} = {i}' for i in range(n))
    nb = dict(cells=[cell('#| export\n' + body(CELL_LINES - 1)),          # exactly the limit: 60 lines
                     cell('#| exporti\n' + body(CELL_LINES)),              # 61
                     cell(body(CELL_LINES + 10)),                          # not exported
                     cell('#| export\n' + body(200), 'markdown'),          # prose
                     cell(['#| export core\n'] + [f'y{i} = {i}\n' for i in range(CELL_LINES)])])   # list source, 61
    assert long_cells(nb) == [(1, CELL_LINES + 1), (4, CELL_LINES + 1)]
    pkg = tmp_path / 'pkg'; (pkg / 'sub').mkdir(parents=True)
    (pkg / 'a.py').write_text(body(MODULE_LINES)); (pkg / 'sub' / 'b.py').write_text(body(MODULE_LINES + 1))
    (pkg / '_modidx.py').write_text(body(MODULE_LINES * 3))
    assert long_modules(pkg) == [('pkg/sub/b.py', MODULE_LINES + 1)]
