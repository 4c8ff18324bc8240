"""Two processes, one directory: a run another process trains is left to it, a restart waits for the runs it would
delete and never deletes through a link, the shards of a sweep share the directory, two writers never tear a file."""
import json, multiprocessing as mp

import pytest

import pe_anchors  # noqa: F401
from pe_anchors.data import digits
from pe_anchors.evaluate import EvalData
from pe_anchors.config import preset
from pe_anchors.sweep import run_experiment, run_one
from pe_anchors.rundir import RunLock

from conftest import cli, fake_run, hold_lock, tiny, tiny_two_seeds


def _hammer(path, k, n):
    from pe_anchors.core import read_json, write_atomic
    bad = 0
    for i in range(n):
        write_atomic(path, json.dumps({'writer': k, 'i': i, 'pad': 'x' * 2000}))
        try: read_json(path)
        except ValueError: bad += 1
    return bad


def test_a_locked_run_is_left_to_its_owner(tmp_path, capsys):
    exp = preset('digits', conditions=['ape'], train_kwargs=dict(epochs=1), ssdc_images=32, n_perms=1, alphas=[])
    data = digits()
    ev = EvalData(data, 32, 64, 'cpu')
    run_dir = tmp_path / 'runs' / 'ape-s0'
    holder = hold_lock(run_dir)
    try:
        assert run_one(exp, data, ev, 'ape', 0, run_dir, device='cpu', show=False) is None
        assert 'another process is running it' in capsys.readouterr().out and not (run_dir / 'results.csv').exists()
    finally: holder.kill(); holder.wait()


def test_an_error_inside_the_run_recorder_shows_its_reason(tmp_path, capsys):
    run = tmp_path / 'run'
    holder = hold_lock(run)
    try:
        rc, err = cli(capsys, 'train', '--out', run, '--epochs', '1', '--bs', '256', '--quiet')
    finally: holder.kill(); holder.wait()
    assert rc == 2 and 'is being trained by another process' in err and 'Exception occured' not in err, err


def test_restart_of_a_run_another_process_trains_deletes_nothing(tmp_path, capsys):
    run = tmp_path / 'run'
    (run / 'checkpoints' / 'epoch_000').mkdir(parents=True)
    (run / 'checkpoints' / 'epoch_000' / 'model.safetensors').write_bytes(b'weights')
    for f in ('metrics.csv', 'final.json', 'model.safetensors'): (run / f).write_text('kept')
    holder = hold_lock(run)
    try: rc, err = cli(capsys, 'train', '--out', run, '--epochs', '1', '--bs', '256', '--restart', '--quiet')
    finally: holder.kill(); holder.wait()
    assert rc == 2 and 'is being trained by another process' in err, err
    assert all((run / f).read_text() == 'kept' for f in ('metrics.csv', 'final.json', 'model.safetensors'))
    assert (run / 'checkpoints' / 'epoch_000' / 'model.safetensors').exists()


def test_restart_waits_for_the_runs_it_would_delete(tmp_path):
    exp = tiny_two_seeds(seeds=[0])
    (tmp_path / 'experiment.json').write_text(json.dumps(exp.to_dict()))
    run = fake_run(tmp_path, exp, 'ape', 0)
    (run / 'results.csv').unlink(); (run / 'results.csv.sha256').unlink()        # a run in progress
    holder = hold_lock(run)
    try:
        with pytest.raises(ValueError, match=r'another process.*ape-s0.*--restart'):
            run_experiment(exp, tmp_path, restart=True, device='cpu', show=False)
        assert (run / 'train' / 'config.json').exists() and (tmp_path / 'experiment.json').exists()   # nothing deleted
    finally: holder.kill(); holder.wait()


def test_restart_is_refused_while_a_sweep_holds_the_directory(tmp_path):
    exp = tiny_two_seeds(seeds=[0])
    (tmp_path / 'experiment.json').write_text(json.dumps(exp.to_dict()))
    fake_run(tmp_path, exp, 'ape', 0)
    holder = hold_lock(tmp_path, shared=True)
    try:
        with pytest.raises(ValueError, match=r'another sweep.*--restart'):
            run_experiment(exp, tmp_path, restart=True, device='cpu', show=False)
        assert (tmp_path / 'runs' / 'ape-s0' / 'results.csv').exists()
        with RunLock(tmp_path, shared=True) as lk: assert lk.acquired           # two sweeps (shards) share it
    finally: holder.kill(); holder.wait()


def test_restart_with_a_symlinked_runs_folder(tmp_path, capsys):
    out, elsewhere = tmp_path / 'exp', tmp_path / 'bigdisk' / 'runs'
    exp = tiny()
    fake_run(tmp_path / 'bigdisk', exp, 'ape', 0)
    out.mkdir(); (out / 'runs').symlink_to(elsewhere)
    rc, err = cli(capsys, 'sweep', 'digits', '--out', out, '--restart', '--epochs', '1', '--quiet')
    assert rc == 2 and 'runs' in err and 'symbolic link' in err, err
    assert (elsewhere / 'ape-s0' / 'results.csv').exists()                     # nothing deleted


def test_two_writers_never_tear_a_file(tmp_path):
    ctx = mp.get_context('spawn')
    with ctx.Pool(2) as pool: bad = pool.starmap(_hammer, [(tmp_path / 'f.json', k, 300) for k in range(2)])
    assert bad == [0, 0] and len(list(tmp_path.iterdir())) == 1
