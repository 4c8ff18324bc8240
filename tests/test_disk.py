"""Disks: every file is written whole or not at all (a full disk, a read-only place, a writer killed midway), a report
is read from a read-only experiment, created files follow the umask."""
import errno, json, os
from pathlib import Path

import pytest

import pe_anchors  # noqa: F401
from pe_anchors.core import read_json, write_atomic
from pe_anchors.learner import train
from pe_anchors.results import write_results

from conftest import FAST, cli, nano_checkpoint


@pytest.fixture(scope='module')
def ckpt(tmp_path_factory):
    import timm
    from pe_anchors.hub import save_checkpoint
    p = tmp_path_factory.mktemp('ck') / 'ape.safetensors'
    return save_checkpoint(timm.create_model('pe_vit_nano_patch2_16', pe='ape', num_classes=10), p)


@pytest.fixture
def finished_run(tmp_path):
    "A run directory as `pe_anchors train` leaves it (a checkpoint and config), without training."
    run = tmp_path / 'run'; run.mkdir()
    nano_checkpoint(run, 'model.safetensors')
    (run / 'config.json').write_text(json.dumps(dict(condition='ape', seed=0, data=dict(builder='digits', img_size=16))))
    return run


def test_writes_are_atomic_under_a_full_disk(tmp_path, monkeypatch):
    p = write_atomic(tmp_path / 'a.json', '{"ok": 1}')
    def full(*a): raise OSError(errno.ENOSPC, 'No space left on device')
    monkeypatch.setattr(os, 'fsync', full)
    with pytest.raises(OSError): write_atomic(p, '{"ok": 2}')
    assert read_json(p) == {'ok': 1} and [f.name for f in tmp_path.iterdir()] == ['a.json']   # old file whole, no temp


def test_analyze_on_a_full_disk_leaves_no_empty_table(tmp_path, capsys, ckpt, monkeypatch):
    def full(*a): raise OSError(errno.ENOSPC, 'No space left on device')
    monkeypatch.setattr(os, 'fsync', full)
    rc, err = cli(capsys, 'analyze', ckpt, '--ssdc-images', '16', '--n-perms', '1', '--device', 'cpu', '--out', tmp_path,
                  '--quiet')
    assert rc == 2 and 'No space left on device' in err and not (tmp_path / 'analysis.csv').exists(), err
    assert not list(tmp_path.glob('.*.tmp'))


def test_a_full_disk_while_saving_the_model(tmp_path, capsys, monkeypatch):
    import safetensors.torch
    def full(*a, **k):
        raise safetensors.SafetensorError('Error while serializing: I/O error: No space left on device (os error 28)')
    monkeypatch.setattr(safetensors.torch, 'save_file', full)
    rc, err = cli(capsys, 'train', '--out', tmp_path / 'run', '--epochs', '1', '--bs', '256', '--quiet')
    assert rc == 2 and 'No space left on device' in err and 'model.safetensors' in err, err


def test_export_to_a_full_disk_leaves_no_folder(finished_run, tmp_path, capsys, monkeypatch):
    import safetensors.torch
    def full(*a, **k):
        raise safetensors.SafetensorError('Error while serializing: I/O error: No space left on device (os error 28)')
    monkeypatch.setattr(safetensors.torch, 'save_file', full)
    rc, err = cli(capsys, 'export', finished_run, tmp_path / 'hub')
    assert rc == 2 and 'No space left on device' in err and str(tmp_path / 'hub') in err and 'free some space' in err, err
    assert not (tmp_path / 'hub').exists() and not list(tmp_path.glob('.hub.*'))      # no folder, complete or not


def test_export_to_a_read_only_place(finished_run, tmp_path, capsys, monkeypatch):
    import tempfile
    def ro(*a, dir=None, **k): raise OSError(errno.EROFS, 'Read-only file system', str(dir))
    monkeypatch.setattr(tempfile, 'mkdtemp', ro)
    rc, err = cli(capsys, 'export', finished_run, tmp_path / 'hub')
    assert rc == 2 and 'Read-only file system' in err and str(tmp_path) in err and 'mounted read-only' in err, err
    assert 'free some space' not in err and not (tmp_path / 'hub').exists(), err


def test_a_hub_folder_is_complete_or_absent(finished_run, tmp_path, monkeypatch):
    from pe_anchors import hub
    from pe_anchors.kept import export_run
    real = hub._model_card
    def torn(*a, **k): raise OSError(errno.ENOSPC, 'No space left on device')   # after the weights, before the card
    monkeypatch.setattr(hub, '_model_card', torn)
    with pytest.raises(OSError, match='No space left'): export_run(finished_run, tmp_path / 'hub')
    assert not (tmp_path / 'hub').exists() and not list(tmp_path.glob('.hub.*'))
    monkeypatch.setattr(hub, '_model_card', real)
    out = export_run(finished_run, tmp_path / 'hub')
    assert sorted(p.name for p in out.iterdir()) == ['README.md', 'config.json', 'model.safetensors']


def test_report_from_a_read_only_experiment_directory(tmp_path, monkeypatch):
    from pe_anchors.testing import synthetic_results
    from pe_anchors.report import write_report
    exp_dir = tmp_path / 'exp'
    write_results(synthetic_results(seeds=(0,)), exp_dir / 'runs' / 'all-s0' / 'results.csv')
    import pe_anchors.core as core
    real = core.write_atomic
    def guarded(path, data):
        if Path(path).resolve().is_relative_to(exp_dir.resolve()): raise OSError(errno.EROFS, 'Read-only file system', str(path))
        return real(path, data)
    for mod in ('pe_anchors.core', 'pe_anchors.results', 'pe_anchors.report'): monkeypatch.setattr(f'{mod}.write_atomic', guarded)
    p = write_report(exp_dir, tmp_path / 'elsewhere')
    assert p.exists() and not (exp_dir / 'results.csv').exists()


def test_created_files_follow_the_umask(small, tmp_path):
    old = os.umask(0o022)
    try:
        train('ape', small, run_dir=tmp_path / 'run', epochs=1, **FAST)
        modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / 'run').rglob('*') if p.name != '.lock'}
    finally: os.umask(old)
    assert modes['config.json'] == 0o644 and modes['model.safetensors'] == 0o644 and modes['epoch_000'] == 0o755
