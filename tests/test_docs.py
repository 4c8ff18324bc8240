"""The documentation site: nbdev's docs processing (everything `nbdev_docs` does short of calling Quarto) runs on the
notebooks in bounded time, executes no experiment, and every module page carries the API entries of its exports.
The site itself renders with Quarto (`nbdev_docs`) where Quarto is installed; these machines have none."""
import importlib, json, re, subprocess, sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NBS = ROOT / 'nbs'


@pytest.fixture(scope='module')
def processed(tmp_path_factory):
    # nbdev's processing into _proc/ (its own cache folder), in a fresh process: `proc_nbs` is the step of `nbdev_docs`
    # before Quarto (`nbdev_proc_nbs` would first try to download Quarto). The timeout guards against a notebook that
    # trains at docs time; it is not a speed target.
    code = "from nbdev.serve import proc_nbs; proc_nbs(n_workers=2, force=True)"
    r = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert 'Found cells containing imports and other code' not in r.stderr, r.stderr[-3000:]
    return ROOT / '_proc'


def _outputs(nb: dict) -> str:
    out = []
    for c in nb['cells']:
        for o in c.get('outputs', []):
            for v in o.get('data', {}).values(): out.append(''.join(v) if isinstance(v, list) else str(v))
            if 'text' in o: out.append(''.join(o['text']))
    return '\n'.join(out)


def test_every_module_page_documents_its_exports(processed):
    for nb_path in sorted(NBS.glob('[0-9]*.ipynb')):
        nb = json.loads(nb_path.read_text())
        m = re.search(r'#\|\s*default_exp\s+(\S+)', '\n'.join(''.join(c['source']) for c in nb['cells']))
        if not m: continue
        mod = importlib.import_module(f'pe_anchors.{m.group(1)}')
        page = _outputs(json.loads((processed / nb_path.name).read_text()))
        documented = [n for n in mod.__all__ if callable(getattr(mod, n)) and not n.startswith('_')]
        missing = [n for n in documented if f'### {n}' not in page]
        assert not missing, f"{nb_path.name}: no API entry for {missing}"


def test_no_references_outside_the_repository():
    for f in [*NBS.glob('*.ipynb'), *(ROOT / 'pe_anchors').rglob('*.py'), ROOT / 'README.md']:
        text = f.read_text()
        assert 'SPEC.md' not in text and '../shared' not in text, f


def test_saved_outputs_are_clean_and_present():
    for nb_path in sorted(NBS.glob('*.ipynb')):
        nb = json.loads(nb_path.read_text())
        text = json.dumps([c.get('outputs', []) for c in nb['cells']])
        assert '/tmp/' not in text and 'FutureWarning' not in text and 'site-packages' not in text, nb_path.name
        code = [c for c in nb['cells'] if c['cell_type'] == 'code']
        if nb_path.stem != 'protocol' and code:
            assert any(c.get('outputs') for c in code), f"{nb_path.name} shows no output"
