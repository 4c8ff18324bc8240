"""Pages that cannot go stale: every page executed by tools/run_notebooks.py records the committed files it read (with
their SHA-256) and the package version in its notebook metadata; a page whose recorded files differ from the files on
disk fails here, by name, and `python tools/run_notebooks.py --stale` re-executes exactly those pages."""
import importlib.util, json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NBS = ROOT / 'nbs'


def _runner():
    spec = importlib.util.spec_from_file_location('run_notebooks', ROOT / 'tools' / 'run_notebooks.py')
    mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
    return mod


def test_no_page_is_stale():
    "Every page's recorded committed tables are the ones on disk (and it ran with this package version)."
    rn = _runner()
    stale = rn.stale_pages(NBS)
    assert not stale, ("pages computed from committed files that have changed since (re-run them: "
                       "python tools/run_notebooks.py --stale && nbdev_clean):\n"
                       + '\n'.join(f"  {p.name}: {'; '.join(why)}" for p, why in stale.items()))


def _page(path: Path, code: str):
    nb = dict(cells=[dict(cell_type='code', id='a1', metadata={}, execution_count=None, outputs=[], source=code)],
              metadata=dict(kernelspec=dict(display_name='python3', language='python', name='python3')),
              nbformat=4, nbformat_minor=5)
    path.write_text(json.dumps(nb))


def test_a_page_records_what_it_read_and_goes_stale_when_it_changes(tmp_path):
    rn = _runner()
    results, nbs = tmp_path / 'results', tmp_path / 'nbs'
    (results / 'exp').mkdir(parents=True); nbs.mkdir()
    table, other = results / 'exp' / 'results.csv', results / 'exp' / 'unread.csv'
    table.write_text('condition,value\nape,0.5\n'); other.write_text('x\n1\n')
    page = nbs / 'page.ipynb'
    _page(page, "import pandas as pd\nprint(pd.read_csv('../results/exp/results.csv').value.sum())")
    rn.main([page], results=results)
    rec = json.loads(page.read_text())['metadata'][rn.KEY]
    assert rec['tables'] == {'results/exp/results.csv': rn.sha256(table)}           # what it read, not what it did not
    assert rec['package']['version'] == rn.package_record()['version']
    assert rn.stale_inputs(page, results) == []
    table.write_text('condition,value\nape,0.6\n')
    assert rn.stale_inputs(page, results) == ['results/exp/results.csv (changed)']
    table.unlink()
    assert rn.stale_inputs(page, results) == ['results/exp/results.csv (missing)']


def test_nbdev_clean_keeps_the_record():
    "settings.ini allows the record's metadata key, so nbdev_clean (which CI runs) does not strip it."
    from nbdev.clean import clean_nb
    from nbdev.config import get_config
    rn = _runner()
    nb = dict(cells=[], metadata={rn.KEY: {'tables': {'results/x.csv': '0' * 64}}, 'other': 1}, nbformat=4, nbformat_minor=5)
    cfg = get_config()
    clean_nb(nb, False, cfg.get('allowed_metadata_keys').split(), cfg.get('allowed_cell_metadata_keys').split())
    assert nb['metadata'] == {rn.KEY: {'tables': {'results/x.csv': '0' * 64}}}
