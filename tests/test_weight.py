"""A weight budget: every clone carries every version of every file, so no file the repository tracks (or would track:
untracked files git does not ignore) may exceed 2 MB except a kept model (`nbs/results/*/runs/*/model/model.safetensors`),
and no notebook may exceed 2 MB; a page re-executed by tools/run_notebooks.py without a changed number is byte-identical
(figures as PNG at 100 dpi, without matplotlib's version stamp)."""
import base64, importlib.util, io, json, re, subprocess
from pathlib import Path, PurePosixPath

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 2_000_000                                        # bytes
KEPT_MODEL = 'nbs/results/*/runs/*/model/model.safetensors'


def _mb(n: int) -> str: return f"{n / 1e6:.2f} MB"


def _repository_files() -> list[str]:
    "The files git tracks or would track (untracked ones it does not ignore), relative to the root; skip outside a checkout."
    try:
        out = subprocess.run(['git', 'ls-files', '-z', '--cached', '--others', '--exclude-standard'], cwd=ROOT,
                             capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"not a git checkout (or no git): {e}")
    return sorted({f for f in out.decode().split('\0') if f and (ROOT / f).is_file()})


def over_budget(root: Path, files) -> list[str]:
    "'  path: size' of each file (relative to `root`) above the limit, kept models excepted."
    return [f"  {f}: {_mb((root / f).stat().st_size)}" for f in files
            if not PurePosixPath(f).match(KEPT_MODEL) and (root / f).stat().st_size > LIMIT]


def test_no_file_over_the_budget_but_kept_models():
    "A tracked file other than a kept model above 2 MB fails, by name (a kept model is the one file that may be large)."
    bad = over_budget(ROOT, _repository_files())
    assert not bad, ("files above the 2 MB budget (every version stays in every clone: make them smaller, or keep them "
                     "out of the repository):\n" + '\n'.join(bad))


def _figure_bytes(nb: Path) -> tuple[int, int]:
    "(number, base64 characters) of the PNG figures saved in a notebook's outputs."
    n = size = 0
    for c in json.loads(nb.read_text())['cells']:
        for o in c.get('outputs', []):
            png = o.get('data', {}).get('image/png')
            if png: n += 1; size += len(''.join(png))
    return n, size


def test_no_notebook_over_the_budget():
    "A notebook above 2 MB fails, naming its figures' share (re-run it with tools/run_notebooks.py: figures at 100 dpi)."
    bad = []
    for nb in sorted((ROOT / 'nbs').rglob('*.ipynb')):
        if '.ipynb_checkpoints' in nb.parts or nb.stat().st_size <= LIMIT: continue
        n, figs = _figure_bytes(nb)
        bad.append(f"  {nb.relative_to(ROOT)}: {_mb(nb.stat().st_size)}, of which {n} figures {_mb(figs)}")
    assert not bad, "notebooks above the 2 MB budget (fewer or smaller figures, shorter outputs):\n" + '\n'.join(bad)


def test_the_budget_check_flags_large_files_and_spares_kept_models(tmp_path):
    "Measured on files written here: one byte over the limit is flagged by name, a kept model of that size is not."
    files = {'nbs/big.ipynb': LIMIT + 1, 'nbs/results/e/runs/ape-s0/model/model.safetensors': LIMIT + 1,
             'nbs/results/e/runs/ape-s0/train/model.safetensors': LIMIT + 1, 'small.txt': LIMIT}
    for f, n in files.items():
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True); (tmp_path / f).write_bytes(b'x' * n)
    assert over_budget(tmp_path, sorted(files)) == ['  nbs/big.ipynb: 2.00 MB',
                                                    '  nbs/results/e/runs/ape-s0/train/model.safetensors: 2.00 MB']


# ---------------------------------------------------------------------------------------------------------------------
# Re-execution is byte-identical

def _runner():
    spec = importlib.util.spec_from_file_location('run_notebooks', ROOT / 'tools' / 'run_notebooks.py')
    mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
    return mod


def test_a_page_with_a_figure_reruns_byte_identically(tmp_path):
    "Two executions of a page drawing a figure give the same bytes; the PNG is at 100 dpi, 8 in about 800 px, unstamped."
    from PIL import Image
    rn = _runner()
    results, page = tmp_path / 'results', tmp_path / 'page.ipynb'
    results.mkdir()
    code = ("import matplotlib.pyplot as plt\n"
            "fig, ax = plt.subplots(figsize=(8, 3)); ax.plot([0, 1, 2], [.1, .5, .3], label='a line'); ax.legend();")
    nb = dict(cells=[dict(cell_type='code', id='f1', metadata={}, execution_count=None, outputs=[], source=code)],
              metadata=dict(kernelspec=dict(display_name='python3', language='python', name='python3')),
              nbformat=4, nbformat_minor=5)
    runs = []
    for _ in range(2):
        page.write_text(json.dumps(nb))
        rn.main([page], results=results)
        runs.append(page.read_bytes())
    assert runs[0] == runs[1]
    pngs = [o['data']['image/png'] for o in json.loads(runs[0])['cells'][0]['outputs'] if 'image/png' in o.get('data', {})]
    assert len(pngs) == 1
    im = Image.open(io.BytesIO(base64.b64decode(''.join(pngs[0]))))
    assert 'Software' not in im.info                                       # no matplotlib version stamp
    assert [round(v) for v in im.info['dpi']] == [100, 100]
    import matplotlib; matplotlib.use('Agg', force=False)
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 3)); ax.plot([0, 1, 2], [.1, .5, .3], label='a line'); ax.legend()
    buf = io.BytesIO(); fig.savefig(buf, format='png', dpi=100, bbox_inches='tight'); plt.close(fig)
    assert im.size == Image.open(buf).size                                 # matplotlib's own 100 dpi rendering (8 in: <= 800 px)


def test_saved_outputs_carry_no_object_addresses():
    "A repr with a memory address (`<... at 0x7f...>`) differs on every run: end such a cell with `;`."
    bad = []
    for nb in sorted((ROOT / 'nbs').glob('*.ipynb')):
        for i, c in enumerate(json.loads(nb.read_text())['cells']):
            for o in c.get('outputs', []):
                text = ''.join(o.get('text', '')) + ''.join(''.join(v) for k, v in o.get('data', {}).items() if k.startswith('text/'))
                if re.search(r' at 0x[0-9a-f]{6,}', text): bad.append(f"  {nb.name} cell {i}")
    assert not bad, "object addresses in saved outputs (they change on every run):\n" + '\n'.join(bad)
