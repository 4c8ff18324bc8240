"""pe_anchors.report: the files written, all at once or not at all, from what the table holds."""
import json

import pandas as pd
import pytest

from pe_anchors.report import EXPERIMENT_DEFAULTS, missing_runs, report_meta, write_report
from pe_anchors.results import load_results, write_results
from pe_anchors.testing import synthetic_results


@pytest.fixture(scope='module')
def df(): return synthetic_results(seeds=(0, 1, 2))


def test_write_report(tmp_path, df):
    p = write_report(df, tmp_path / 'rep', title='t')
    text = p.read_text()
    for f in ('fig1', 'fig2', 'fig3', 'fig4', 'fig5', 'fig_alpha'):
        assert (tmp_path / 'rep' / 'figures' / f'{f}.png').exists() and f'figures/{f}.png' in text
    assert '## Verdicts: tests' in text and '## Sanity checks' in text and 'holds by construction' in text
    assert '<table' in (tmp_path / 'rep' / 'report.html').read_text()


def test_the_report_prints_the_verdict_tables_as_every_page(tmp_path, df):
    """Each verdict table with its caption and its key, as `verdict_markdown` prints it on the pages; in the HTML, its links
    point to the documentation site (settings.ini) and its emphasis is HTML, not asterisks."""
    import configparser, re
    from pathlib import Path
    from pe_anchors.tables import verdict_markdown
    text = write_report(df, tmp_path / 'rep').read_text()
    page = (tmp_path / 'rep' / 'report.html').read_text()
    cfg = configparser.ConfigParser(); cfg.read(Path(__file__).resolve().parents[1] / 'settings.ini')
    site = cfg['DEFAULT']['doc_host'].rstrip('/') + '/' + cfg['DEFAULT']['doc_baseurl'].strip('/')
    for kind in ('test', 'sanity check'):
        want = verdict_markdown(df, kind)
        assert want.replace('](stats.html', f']({site}/stats.html') in text, kind
    assert 'deciding part' in text and f'<a href="{site}/stats.html#' in page and '<b>contradicts</b>' in page
    assert not re.search(r'\*\*\w', page), 'markdown bold left in the HTML'


def test_a_killed_report_leaves_the_old_one_whole(tmp_path, df, monkeypatch):
    dest = tmp_path / 'rep'
    write_report(df[df.seed == 0], dest, title='old')
    before = {p.relative_to(dest): p.read_bytes() for p in dest.rglob('*') if p.is_file()}
    import pe_anchors.report as rep
    real = rep._save
    def die(fig, d, name):
        if name == 'fig4': raise KeyboardInterrupt
        return real(fig, d, name)
    monkeypatch.setattr(rep, '_save', die)
    with pytest.raises(KeyboardInterrupt): write_report(df, dest, title='new')
    after = {p.relative_to(dest): p.read_bytes() for p in dest.rglob('*') if p.is_file()}
    assert after == before and not list(tmp_path.glob('.rep.*'))         # the old report, whole; no leftovers
    monkeypatch.setattr(rep, '_save', real)
    write_report(df, dest, title='new')
    assert 'seed(s) [0, 1, 2]' in (dest / 'report.md').read_text()


def test_a_folder_that_is_not_a_report_is_refused(tmp_path, df):
    (tmp_path / 'mine').mkdir(); (tmp_path / 'mine' / 'notes.txt').write_text('x')
    with pytest.raises(ValueError, match='not a report'): write_report(df, tmp_path / 'mine')
    assert (tmp_path / 'mine' / 'notes.txt').read_text() == 'x'


@pytest.mark.parametrize('conds', [['ape'], ['nope'], ['rpt'], ['rope', 'spe'], ['nope', 'rpt'], ['ape', 'rpt']])
def test_report_on_subsets_of_conditions(tmp_path, df, conds):
    p = write_report(df[df.condition.isin(conds)], tmp_path / 'r', title='subset')
    text = p.read_text()
    assert 'Verdicts' in text and (tmp_path / 'r' / 'results.csv').exists()
    assert 'n/a' in text or "None of the paper's claims" in text


def test_report_from_a_csv_with_its_meta(tmp_path, df):
    write_results(df, tmp_path / 'r' / 'results.csv')
    (tmp_path / 'r' / 'meta.json').write_text(json.dumps(dict(
        experiment=dict(name='from-csv', data='cifar10', data_kwargs=dict(path='/secret/place/cifar.npz'), model='m',
                        recipe='fast', train_kwargs={}, ssdc_images=10, n_perms=2, rpi_mode='rpi'),
        runs=[dict(hardware='CPU x', train_and_init_s=60., eval_s=30.)])))
    text = write_report(tmp_path / 'r' / 'results.csv', tmp_path / 'out').read_text()
    assert 'from-csv' in text and 'cifar.npz' in text and '/secret/place' not in text and 'CPU x' in text


def test_report_of_an_experiment_file_without_newer_fields(tmp_path, df):
    "An experiment.json (or meta.json) written before rpi_mode and other fields existed reads them as their defaults."
    from pe_anchors.core import N_PERMS
    from pe_anchors.experiment import Experiment
    defaults = Experiment.defaults()
    assert {k: defaults[k] for k in EXPERIMENT_DEFAULTS} == EXPERIMENT_DEFAULTS
    write_results(df, tmp_path / 'r' / 'results.csv')
    old = dict(name='old', data='cifar10', model='m', recipe='fast', train_kwargs={}, ssdc_images=10, n_perms=2)
    (tmp_path / 'r' / 'meta.json').write_text(json.dumps(dict(experiment=old, runs=[dict(hardware='CPU x', eval_s=30.)])))
    text = write_report(tmp_path / 'r' / 'results.csv', tmp_path / 'out').read_text()
    assert 'RPI averaged over 2 permutation draws (rpi)' in text and 'CPU x' in text
    (tmp_path / 'd').mkdir()
    (tmp_path / 'd' / 'experiment.json').write_text(json.dumps(dict(name='old')))
    m = report_meta(tmp_path / 'd')
    assert m['experiment']['rpi_mode'] == 'rpi' and m['experiment']['n_perms'] == N_PERMS and m['experiment']['name'] == 'old'


def test_runs_the_experiment_declares_but_its_table_lacks_are_stated(tmp_path, df):
    "A seed dropped (or not finished yet) is said: the experiment's conditions × seeds against the runs in its table."
    write_results(df, tmp_path / 'r' / 'results.csv')
    conds = sorted(df['condition'].unique())
    (tmp_path / 'r' / 'meta.json').write_text(json.dumps(dict(experiment=dict(name='e', conditions=conds, seeds=[0, 1, 2, 3]))))
    table = tmp_path / 'r' / 'results.csv'
    assert missing_runs(report_meta(table)['experiment'], load_results(table)) == [f'{c}-s3' for c in conds]
    assert missing_runs(None, df) == [] and missing_runs(dict(conditions=conds, seeds=[0, 1, 2]), df) == []
    text = write_report(table, tmp_path / 'out').read_text()
    assert f"not in the table, though the experiment declares them: {', '.join(f'{c}-s3' for c in conds)}" in text


def _tree(d) -> dict:
    "Every file under `d` (the git repository's too) and its bytes."
    from pathlib import Path
    return {str(p.relative_to(d)): p.read_bytes() for p in Path(d).rglob('*') if p.is_file()}


def test_report_dest_dot_in_a_project_folder_touches_nothing(tmp_path, df, capsys, monkeypatch):
    "The issue's case: `report --dest .` in a folder with a git repository, sources, data and its own report.md."
    import subprocess
    from conftest import cli
    proj = tmp_path / 'project'; (proj / 'src').mkdir(parents=True)
    subprocess.run(['git', 'init', '-q', str(proj)], check=True)
    (proj / 'src' / 'main.py').write_text('print(1)\n'); (proj / 'data.csv').write_text('a,b\n1,2\n')
    (proj / 'report.md').write_text('# my own notes\n')
    subprocess.run(['git', '-C', str(proj), 'add', '-A'], check=True)
    subprocess.run(['git', '-C', str(proj), '-c', 'user.email=a@b', '-c', 'user.name=a', 'commit', '-qm', 'x'], check=True)
    write_results(df, tmp_path / 'r.csv')
    before = _tree(proj)
    monkeypatch.chdir(proj)
    rc, err = cli(capsys, 'report', tmp_path / 'r.csv', '--dest', '.')
    assert rc == 2 and 'holds files that are not a report' in err and '.git' in err and 'nothing was changed' in err, err
    assert _tree(proj) == before and sorted(p.name for p in tmp_path.iterdir()) == ['project', 'r.csv', 'r.csv.sha256']   # nor beside it
    assert subprocess.run(['git', '-C', str(proj), 'status', '--porcelain'], capture_output=True, text=True).stdout == ''


def test_a_report_replaces_only_its_own_files(tmp_path, df):
    "An earlier report's folder: its files are replaced (a figure it no longer draws goes), a file the user added stays."
    dest = tmp_path / 'rep'
    write_report(df, dest, title='all')
    assert (dest / 'figures' / 'fig5.png').exists()
    (dest / 'notes.txt').write_text('mine'); (dest / 'figures' / 'mine.png').write_bytes(b'x')
    write_report(df[df.condition.isin(['ape', 'nope'])], dest, title='two')     # no RPT: no Figure 5
    assert not (dest / 'figures' / 'fig5.png').exists() and 'pe_anchors report: two' in (dest / 'report.md').read_text()
    assert (dest / 'notes.txt').read_text() == 'mine' and (dest / 'figures' / 'mine.png').read_bytes() == b'x'
    assert sorted(p.name for p in tmp_path.iterdir()) == ['rep']                  # no staging copy left beside it


def test_the_report_path_loads_no_training_stack(tmp_path, df):
    """`import pe_anchors.report`, then the `pe_anchors report` command, in a fresh interpreter: neither fastai nor the
    learner is imported (a report is tables and figures from a CSV)."""
    import os, subprocess, sys
    csv = write_results(df, tmp_path / 'results.csv')
    code = ("import sys; import pe_anchors.report; after_import = set(sys.modules)\n"
            "from pe_anchors.cli import main; rc = main(['report', sys.argv[1], '--dest', sys.argv[2]])\n"
            "heavy = ('fastai', 'pe_anchors.learner')\n"
            "print('loaded:', [m for m in heavy if m in after_import], [m for m in heavy if m in sys.modules], rc)")
    r = subprocess.run([sys.executable, '-c', code, str(csv), str(tmp_path / 'rep')], capture_output=True, text=True,
                       timeout=900, env={**os.environ, 'OMP_NUM_THREADS': '1'})
    assert r.stdout.strip().splitlines()[-1] == 'loaded: [] [] 0', r.stdout[-2000:] + r.stderr[-2000:]
    assert (tmp_path / 'rep' / 'report.md').exists()
