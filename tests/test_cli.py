"""The console script: help, exit codes, errors without tracebacks, a run given at any of its levels to every command
that takes one, and the offline demo in small size."""
import os, subprocess

import pytest

from pe_anchors.cli import main
from pe_anchors.rundir import ExperimentDir

from conftest import cli
import numpy as np
import pandas as pd
import torch
from pe_anchors.evaluate import EvalData, evaluate_model
from pe_anchors.config import Experiment

ENV = {**os.environ, 'PE_ANCHORS_QUIET': '1', 'MPLBACKEND': 'Agg'}


def run(*args, **kw):
    return subprocess.run(['pe_anchors', *args], capture_output=True, text=True, env=ENV, **kw)


@pytest.fixture(scope='module')
def installed():
    if subprocess.run(['which', 'pe_anchors'], capture_output=True).returncode:
        pytest.skip('the pe_anchors console script is not installed (pip install -e .)')


def test_help_everywhere(installed):
    r = run('--help'); assert r.returncode == 0 and 'demo' in r.stdout and 'sweep' in r.stdout
    for cmd in ('demo', 'train', 'analyze', 'sweep', 'report', 'export', 'study', 'bench', 'atlas'):
        r = run(cmd, '--help'); assert r.returncode == 0 and 'usage: pe_anchors ' + cmd in r.stdout, cmd


def test_user_errors_exit_2_without_traceback(installed, tmp_path):
    for args, msg in ((('report', str(tmp_path / 'nothing')), 'no experiment at'),
                      (('sweep', 'cifar10', '--out', str(tmp_path)), 'needs the data location'),
                      (('sweep', str(tmp_path / 'exp.yaml'), '--out', str(tmp_path)), 'no experiment file'),
                      (('train', '--condition', 'cape', '--run-dir', str(tmp_path / 'r')), "unknown condition 'cape'")):
        r = run(*args)
        assert r.returncode == 2, (args, r.stderr)
        assert msg in r.stderr and 'Traceback' not in r.stderr, r.stderr
    assert run('bench', 'nothing').returncode == 2                      # argparse's own usage error


def test_demo_small_then_report_and_analyze(installed, tmp_path):
    out = tmp_path / 'demo'
    r = run('demo', '--out', str(out), '--epochs', '1', '--conditions', 'nope', 'ape', '--quiet', timeout=900)
    assert r.returncode == 0, r.stderr
    assert (out / 'report' / 'report.md').exists() and (out / 'results.csv').exists()
    lines = r.stdout.strip().splitlines()
    assert 'Against the committed digits reference' in r.stdout and "The reference's verdicts" in r.stdout
    assert 'not like for like: your train_kwargs differ' in r.stdout            # one epoch, not the reference's twelve
    assert lines[-1].startswith('report: ') and len(lines[[l.startswith('done in') for l in lines].index(True):]) <= 25
    r = run('report', str(out)); assert r.returncode == 0 and 'report:' in r.stdout
    for level in ('', 'train', 'model', 'train/model.safetensors'):      # a run at each of its natural levels
        r = run('analyze', str(out / 'runs' / 'ape-s0' / level), '--ssdc-images', '32', '--n-perms', '2',
                '--out', str(tmp_path / f'a{len(level)}'))
        assert r.returncode == 0, (level, r.stderr)
        assert (tmp_path / f'a{len(level)}' / 'analysis.csv').exists() and 'rpi' in r.stdout
        assert 'peak RPI-SSDC' in r.stdout                              # where anchoring forms, beside ΔSSDC
    r = run('study', str(out), '--resolution', '--sizes', '16', '24', '--quiet')   # the kept models, asked again
    assert r.returncode == 0, r.stderr
    assert (out / 'resolution.csv').exists() and 'index' in r.stdout
    r = run('study', str(out))
    assert r.returncode == 2 and 'say what to study' in r.stderr


def test_export_writes_a_hub_folder_that_timm_loads(installed, tmp_path):
    import timm, torch
    from pe_anchors.experiment import load_run_model
    out = tmp_path / 'demo'
    r = run('demo', '--out', str(out), '--epochs', '1', '--conditions', 'ape', '--quiet', timeout=900)
    assert r.returncode == 0, r.stderr
    assert 'ΔSSDC' in r.stdout and 'peak' in r.stdout                     # where anchoring forms
    r = run('export', str(out / 'runs' / 'ape-s0'), str(tmp_path / 'hub'), '--title', 'tiny APE')
    assert r.returncode == 0, r.stderr
    card = (tmp_path / 'hub' / 'README.md').read_text()
    assert '# tiny APE' in card and 'ΔSSDC' in card and 'digits at 16 px' in card and str(tmp_path) not in card
    back = timm.create_model(f"local-dir:{tmp_path / 'hub'}", pretrained=True).eval()
    x = torch.randn(2, 3, 16, 16)
    torch.testing.assert_close(back(x), load_run_model(out, 'ape', 0)(x), rtol=0, atol=1e-6)
    r = run('export', str(out / 'runs' / 'ape-s0'), str(tmp_path / 'hub'))          # an existing folder is not overwritten
    assert r.returncode == 2 and 'not an empty folder' in r.stderr and 'Traceback' not in r.stderr, r.stderr
    r = run('export', str(tmp_path / 'none'), str(tmp_path / 'hub2'))
    assert r.returncode == 2 and 'no run at' in r.stderr and 'expected a run directory' in r.stderr


def test_main_in_process_returns_codes(tmp_path, capsys):
    assert main(['report', str(tmp_path / 'none')]) == 2
    assert 'error' in capsys.readouterr().err


def test_bad_inputs_exit_2_with_one_line(installed, tmp_path, capsys):
    # in process (the console script is `main`; one process per case cost a torch import each): the exit code and stderr
    import torch
    cases = [(('train', '--bs', '0', '--out', str(tmp_path / 'r')), 'must be >= 1'),
             (('train', '--epochs', '0', '--out', str(tmp_path / 'r')), 'must be >= 1'),
             (('train', '--device', 'tpu', '--out', str(tmp_path / 'r')), "unknown device 'tpu'"),
             (('train', '--data', 'image_folder', '--out', str(tmp_path / 'r')), 'needs --data-path'),
             (('train', '--data', 'digits', '--data-path', '/x', '--out', str(tmp_path / 'r')), '--data-path is for cifar10'),
             (('train', '--pe', 'cape', '--out', str(tmp_path / 'r')), "unknown positional encoding 'cape'"),
             (('sweep', 'digits', '--out', str(tmp_path / 's'), '--cbs', 'nonsense'), "unknown callback 'nonsense'")]
    if not torch.cuda.is_available():
        cases.append((('train', '--device', 'cuda', '--out', str(tmp_path / 'r')), 'no CUDA GPU'))
    threads = torch.get_num_threads()
    try:
        for args, msg in cases:
            try: code = main(list(args))
            except SystemExit as e: code = e.code                    # argparse's own errors
            err = capsys.readouterr().err
            assert code == 2, (args, err)
            lines = [l for l in err.strip().splitlines() if l.strip() and 'Warning' not in l and 'warnings.warn' not in l]
            assert len(lines) in (1, 2) and msg in err and 'Traceback' not in err, (args, err)
    finally: torch.set_num_threads(threads)                            # a command sets the torch threads it uses
    assert not (tmp_path / 'r').exists() and not (tmp_path / 's').exists()   # refused before anything was written
    r = run('--version'); assert r.returncode == 0 and r.stdout.startswith('pe_anchors ')


def test_restart_starts_a_run_over(installed, tmp_path):
    out = tmp_path / 'r'
    common = ('train', '--out', str(out), '--epochs', '1', '--bs', '256', '--quiet')
    assert run(*common, timeout=600).returncode == 0
    r = run('train', '--out', str(out), '--epochs', '1', '--bs', '128', '--quiet', timeout=600)
    assert r.returncode == 2 and 'holds a different run' in r.stderr and '--restart' in r.stderr
    assert run('train', '--out', str(out), '--epochs', '1', '--bs', '128', '--quiet', '--restart', timeout=600).returncode == 0


def test_help_texts_and_defaults_come_from_the_library(monkeypatch):
    "Each list and default the options name is the library's: every condition, PE, dataset, preset, recipe, callback."
    import re
    from pe_anchors import cli
    from pe_anchors.core import CONDITIONS, N_PERMS
    from pe_anchors.data import DATASETS, takes_path
    from pe_anchors.experiment import PRESETS, Experiment
    from pe_anchors.learner import CALLBACKS, RECIPES
    from pe_anchors.pos_embed import PE_NAMES
    flat = lambda cmd: ' '.join(cli.parser(cmd)._subparsers._group_actions[0].choices[cmd].format_help().split())
    train, sweep, analyze = flat('train'), flat('sweep'), flat('analyze')
    for names, text in ((CONDITIONS, train), (CONDITIONS, sweep), (PE_NAMES, train), (DATASETS, train), (PRESETS, sweep),
                        (RECIPES, train), (CALLBACKS, sweep)):
        missing = [n for n in names if not re.search(rf'(?<![\w-]){re.escape(n)}(?![\w-])', text)]
        assert not missing, missing
    a = cli.parser().parse_args(['analyze', 'm.safetensors'])
    assert (a.ssdc_images, a.n_perms) == (Experiment.defaults()['ssdc_images'], N_PERMS)
    monkeypatch.delenv('PE_ANCHORS_CIFAR10', raising=False)
    for name in (n for n in DATASETS if takes_path(n)):
        with pytest.raises(cli.UserError, match=f'--data {name} needs --data-path'): cli._dataset(name, None)
    with pytest.raises(cli.UserError, match='or set PE_ANCHORS_CIFAR10'): cli._dataset('cifar10', None)
    with pytest.raises(cli.UserError, match='--data-path is for cifar10, imagenet100, image_folder'): cli._dataset('digits', 'x')


def test_cbs_from_the_command_line_reach_every_run(tmp_path, monkeypatch):
    import pe_anchors.sweep as E                                        # where the command line takes it from
    from pe_anchors.cli import main
    seen = {}
    def fake(exp, out, **kw):
        from pe_anchors.results import RESULT_COLUMNS
        seen.update(exp=exp, **kw); return pd.DataFrame(columns=RESULT_COLUMNS)       # the table's schema, no runs
    monkeypatch.setattr(E, 'run_experiment', fake)
    assert main(['sweep', 'digits', '--out', str(tmp_path), '--cbs', 'csv', 'fastai.callback.progress:CSVLogger', '--quiet']) == 0
    assert seen['exp'].callbacks == ['csv'] and seen['extra_callbacks'] == ['fastai.callback.progress:CSVLogger']


def test_analyze_takes_the_condition_from_the_checkpoint(tmp_path, capsys):
    import timm
    from pe_anchors.cli import main
    from pe_anchors.hub import save_checkpoint
    save_checkpoint(timm.create_model('pe_vit_nano_patch2_16', pe='rope', num_classes=10), tmp_path / 'rope.safetensors')
    args = ['analyze', str(tmp_path / 'rope.safetensors'), '--ssdc-images', '16', '--n-perms', '1', '--device', 'cpu']
    assert main(args + ['--condition', 'ape', '--out', str(tmp_path / 'a')]) == 2
    err = capsys.readouterr().err
    assert "--condition ape" in err and "rope" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / 'a' / 'analysis.csv').exists()
    assert main(args + ['--out', str(tmp_path / 'b')]) == 0
    assert set(pd.read_csv(tmp_path / 'b' / 'analysis.csv')['condition']) == {'rope'}


def test_analyze_measures_a_peg_with_another_padding(tmp_path, capsys):
    "`analyze --padding circular` gives the rows `peg_padding` gives in Python, tagged; a model without a PEG is refused."
    import timm
    from pe_anchors.cli import main
    from pe_anchors.data import get_data
    from pe_anchors.interventions import peg_padding
    from pe_anchors.hub import save_checkpoint
    torch.manual_seed(0)
    peg = timm.create_model('pe_vit_nano_patch2_16', pe='peg', num_classes=10).eval()
    save_checkpoint(peg, tmp_path / 'peg.safetensors')
    save_checkpoint(timm.create_model('pe_vit_nano_patch2_16', pe='rope', num_classes=10), tmp_path / 'rope.safetensors')
    args = ['--ssdc-images', '16', '--n-perms', '1', '--device', 'cpu', '--quiet']
    assert main(['analyze', str(tmp_path / 'rope.safetensors'), '--padding', 'circular', '--out', str(tmp_path / 'r'), *args]) == 2
    err = capsys.readouterr().err
    assert 'PEG' in err and len(err.strip().splitlines()) == 1 and not (tmp_path / 'r' / 'analysis.csv').exists()
    for p in ('zeros', 'circular'):
        assert main(['analyze', str(tmp_path / 'peg.safetensors'), '--padding', p, '--out', str(tmp_path / p), *args]) == 0
    zeros, circ = (pd.read_csv(tmp_path / p / 'analysis.csv') for p in ('zeros', 'circular'))
    assert set(zeros['padding']) == {'zeros'} and set(circ['padding']) == {'circular'}
    # the same measurement in Python, with the convolution padded circularly by hand
    with peg_padding(peg, 'circular'):
        ev = EvalData(get_data('digits'), 16, 256, 'cpu')
        ref = evaluate_model(peg, ev, Experiment(name='digits', conditions=['peg'], ssdc_images=16, n_perms=1), 'peg', show=False)
    assert peg.pos_embed.proj.padding_mode == 'zeros'                                    # restored on exit
    key = ['metric', 'mode', 'layer', 'shift', 'severity']
    ssdc = lambda d: d[d['metric'] == 'ssdc'].sort_values(key)['value'].to_numpy()
    np.testing.assert_allclose(ssdc(circ), ssdc(ref), atol=1e-6)
    assert not np.allclose(ssdc(circ), ssdc(zeros), atol=1e-6)                     # the padding changed what was measured


def test_every_command_takes_a_run_at_any_of_its_levels(tmp_path, capsys):
    "`train`, `analyze` and `export` take the run, its train/ or its model file; a command that wants an experiment names it."
    exp = ExperimentDir(tmp_path / 'exp')
    run = exp.run('ape', 0)
    common = ('--epochs', '1', '--bs', '256', '--device', 'cpu', '--quiet')
    assert cli(capsys, 'train', '--out', run.train.path, *common)[0] == 0
    trained = run.train.model.stat().st_mtime_ns
    levels = (run.path, run.train.path, run.train.model)
    for i, level in enumerate(levels):
        assert cli(capsys, 'train', '--out', level, *common)[0] == 0, level            # the finished run, not trained again
        assert cli(capsys, 'analyze', level, '--ssdc-images', '16', '--n-perms', '1', '--device', 'cpu',
                   '--out', tmp_path / f'a{i}', '--quiet')[0] == 0, level
        assert cli(capsys, 'export', level, tmp_path / f'hub{i}')[0] == 0, level
    assert run.train.model.stat().st_mtime_ns == trained
    tables = [pd.read_csv(tmp_path / f'a{i}' / 'analysis.csv') for i in range(3)]
    assert all(t.equals(tables[0]) for t in tables)                                      # the same model each time
    cards = {(tmp_path / f'hub{i}' / 'README.md').read_text() for i in range(3)}
    assert len(cards) == 1
    for argv, words in ((('report', run.path), 'is a run of the experiment'), (('study', run.path, '--mech'), 'is a run of the experiment'),
                        (('sweep', 'digits', '--out', run.path), 'is a run, not an experiment directory'),
                        (('export', run.train.config, tmp_path / 'hub9'), 'is a file, not a run'),
                        (('analyze', tmp_path / 'nowhere'), 'no trained model at')):
        rc, err = cli(capsys, *argv)
        assert rc == 2 and words in err, (argv, err)
