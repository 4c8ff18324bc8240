"""What one notebook leaves behind for the next. `nbdev_test --n_workers N` runs the notebooks in N worker processes,
several one after another in the same process: a notebook that switches autograd off for its examples at top level
(`torch.set_grad_enabled(False)`) and does not switch it on again breaks every later notebook of that process that
trains ("element 0 of tensors does not require grad"), and only when the scheduling puts them together."""
import json, re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GRAD = re.compile(r'^torch\.(?:autograd\.)?set_grad_enabled\((True|False)\)', re.M)   # top level only: not in a `with`


def grad_left_off(sources: list[str]) -> bool:
    "Whether code cells `sources`, run in order, leave autograd switched off at top level."
    on = True
    for src in sources:
        for m in GRAD.finditer(src): on = m.group(1) == 'True'
    return not on


def code_cells(path: Path) -> list[str]:
    nb = json.loads(path.read_text())
    return [''.join(c['source']) for c in nb['cells'] if c['cell_type'] == 'code']


def test_the_check_tells_a_notebook_that_leaves_autograd_off():
    assert grad_left_off(['x = 1\ntorch.set_grad_enabled(False)   # examples only\n', 'y = 2\n'])
    assert not grad_left_off(['torch.set_grad_enabled(False)\n', 'torch.set_grad_enabled(True)\n'])
    assert not grad_left_off(['with torch.no_grad():\n    y = 1\n', 'with torch.set_grad_enabled(False):\n    z = 1\n'])
    assert grad_left_off(['torch.set_grad_enabled(True)\n', 'torch.autograd.set_grad_enabled(False)\n'])


def test_no_notebook_leaves_autograd_off():
    left = [p.name for p in sorted((ROOT / 'nbs').glob('*.ipynb')) if grad_left_off(code_cells(p))]
    assert left == [], f"these notebooks switch autograd off and leave it off (use `with torch.no_grad():`): {left}"
