"""The console script: help, exit codes, errors without tracebacks, and the offline demo in small size."""
import os, subprocess, sys
from pathlib import Path

import pytest

from pe_anchors.cli import main

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
    for args, msg in ((('report', str(tmp_path / 'nothing')), 'is not an experiment directory'),
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
    assert 'ours:' in r.stdout and 'report:' in r.stdout
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
    assert 'peak RPI-SSDC' in r.stdout
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
    assert r.returncode == 2 and 'is not a run directory' in r.stderr


def test_main_in_process_returns_codes(tmp_path, capsys):
    assert main(['report', str(tmp_path / 'none')]) == 2
    assert 'error' in capsys.readouterr().err


def test_bad_inputs_exit_2_with_one_line(installed, tmp_path):
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
    for args, msg in cases:
        r = run(*args, timeout=300)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        lines = [l for l in r.stderr.strip().splitlines() if l.strip() and 'Warning' not in l and 'warnings.warn' not in l]
        assert len(lines) in (1, 2) and msg in r.stderr and 'Traceback' not in r.stderr, (args, r.stderr)
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
