"""pe_anchors.sweep: the grid of runs, shards from the launchers' variables, an experiment built a condition at a
time, its cost printed and its mistakes refused before anything is written."""
import json, os

import pytest

import pe_anchors  # noqa: F401
from pe_anchors.results import gather
from pe_anchors.config import preset
from pe_anchors.sweep import resolve_shard, run_dir_of, run_experiment
from pe_anchors.cli import main

from conftest import fake_run, exp_file, tiny, tiny_two_conditions, tiny_two_seeds


def test_runs_order_and_shards_partition_the_grid():
    exp = tiny_two_conditions(conditions=['nope', 'ape', 'spe'], seeds=[0, 1])
    runs = exp.runs()
    shards = [runs[i::3] for i in range(3)]
    assert sorted(sum(shards, [])) == sorted(runs) and len(set(map(tuple, runs))) == 6
    assert resolve_shard('2/3') == (2, 3, None)
    with pytest.raises(ValueError): resolve_shard('3/3')


def test_resolve_shard_from_slurm(monkeypatch):
    monkeypatch.setenv('SLURM_ARRAY_TASK_ID', '4'); monkeypatch.setenv('SLURM_ARRAY_TASK_COUNT', '5')
    monkeypatch.delenv('WORLD_SIZE', raising=False)
    assert resolve_shard('auto') == (4, 5, None)


@pytest.mark.parametrize('first', [0, 1, 5])
def test_slurm_arrays_from_any_first_index_cover_every_run(monkeypatch, first):
    monkeypatch.delenv('WORLD_SIZE', raising=False)
    runs = tiny_two_seeds(conditions=['ape', 'nope', 'spe'], seeds=[0, 1]).runs()
    got = []
    for task in range(first, first + 3):                                        # --array=FIRST-(FIRST+2)
        monkeypatch.setenv('SLURM_ARRAY_TASK_ID', str(task)); monkeypatch.setenv('SLURM_ARRAY_TASK_MIN', str(first))
        monkeypatch.setenv('SLURM_ARRAY_TASK_COUNT', '3')
        i, n, _ = resolve_shard('auto')
        got += runs[i::n]
    assert sorted(got) == sorted(runs) and len(got) == len(runs)               # every run once, none twice


def test_a_slurm_index_outside_the_array_is_refused(monkeypatch):
    monkeypatch.delenv('WORLD_SIZE', raising=False)
    monkeypatch.setenv('SLURM_ARRAY_TASK_ID', '3'); monkeypatch.setenv('SLURM_ARRAY_TASK_MIN', '0')
    monkeypatch.setenv('SLURM_ARRAY_TASK_COUNT', '3')
    with pytest.raises(ValueError, match=r'SLURM_ARRAY_TASK_ID=3.*0\.\.2'): resolve_shard('auto')
    monkeypatch.setenv('SLURM_ARRAY_TASK_ID', '4'); monkeypatch.setenv('SLURM_ARRAY_TASK_MIN', '0')
    monkeypatch.setenv('SLURM_ARRAY_TASK_STEP', '2'); monkeypatch.setenv('SLURM_ARRAY_TASK_COUNT', '3')   # --array=0-4:2
    assert resolve_shard('auto')[:2] == (2, 3)


def test_torchrun_ranks_cover_every_run(monkeypatch):
    runs = tiny_two_seeds(conditions=['ape', 'nope', 'spe']).runs()
    got = []
    for rank in range(4):
        monkeypatch.setenv('WORLD_SIZE', '4'); monkeypatch.setenv('RANK', str(rank)); monkeypatch.setenv('LOCAL_RANK', str(rank))
        i, n, local = resolve_shard('auto')
        assert (i, n, local) == (rank, 4, rank) and os.environ['WORLD_SIZE'] == '1'   # no DDP inside a run
        got += runs[i::n]
    assert sorted(got) == sorted(runs)
    monkeypatch.setenv('WORLD_SIZE', '4'); monkeypatch.setenv('RANK', '4')
    with pytest.raises(ValueError, match=r'RANK=4.*0\.\.3'): resolve_shard('auto')


def test_a_condition_at_a_time_builds_one_experiment(tmp_path, digits):
    "Running the conditions one by one in one directory (`sweep --condition X`) adds runs to the same experiment."
    run_experiment(tiny_two_conditions(conditions=['ape']), tmp_path, show=False, data=digits, device='cpu')
    assert json.loads((tmp_path / 'experiment.json').read_text())['conditions'] == ['ape']
    df = run_experiment(tiny_two_conditions(conditions=['nope']), tmp_path, show=False, data=digits, device='cpu')
    assert json.loads((tmp_path / 'experiment.json').read_text()) == tiny_two_conditions(conditions=['ape', 'nope']).to_dict()
    assert set(df['condition']) == {'nope', 'ape'}                    # the table gathers every finished run
    stamp = (run_dir_of(tmp_path, 'ape', 0) / 'results.csv').stat().st_mtime_ns
    run_experiment(tiny_two_conditions(), tmp_path, show=False, data=digits, device='cpu')   # the whole set: nothing left to train
    assert (run_dir_of(tmp_path, 'ape', 0) / 'results.csv').stat().st_mtime_ns == stamp
    with pytest.raises(ValueError, match=r"differs in \['n_perms'\]"):
        run_experiment(tiny_two_conditions(conditions=['ape'], n_perms=3), tmp_path, data=digits)


def test_shards_fill_one_table(tmp_path, digits):
    exp = tiny_two_conditions()
    run_experiment(exp, tmp_path, shard='0/2', show=False, data=digits, device='cpu')
    assert set(gather(tmp_path, write=False)['condition']) == {'nope'}
    df = run_experiment(exp, tmp_path, shard='1/2', show=False, data=digits, device='cpu')
    assert set(df['condition']) == {'nope', 'ape'}


def test_a_sweep_prints_its_cost_before_it_starts(tmp_path, capsys):
    from pe_anchors.data import digits
    from pe_anchors.experiment import experiment_cost
    exp = tiny(n_perms=3)
    d = digits(background=64)
    c = experiment_cost(exp, d)
    assert c['trained'] == 2 * 1 * len(d.train) and c['measured'] > 2 * 32 * (1 + 3)
    assert experiment_cost(tiny(n_perms=30), d)['measured'] > c['measured']
    for cond, s in exp.runs(): fake_run(tmp_path, exp, cond, s)        # finished: the sweep only gathers them
    f = exp_file(tmp_path, n_perms=3)
    rc = main(['sweep', str(f), '--out', str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0 and f"2 run(s) × 1 epoch(s) × {len(d.train):,} images = {2 * len(d.train):,} training images" in out, out
    assert f"measuring: {c['measured']:,} images" in out and '3 permutation draw(s)' in out, out


def test_bad_experiments_fail_before_anything_is_written(tmp_path):
    bad = [dict(train_kwargs=dict(epochs=1, lrr=1)), dict(model_kwargs=dict(depth=1)), dict(model_kwargs=dict(dept=2))]
    for kw, msg in zip(bad, ('unknown recipe field', 'needs at least 2', 'do not fit')):    # refused when made, or when run
        with pytest.raises(ValueError, match=msg): run_experiment(preset('digits', **kw), tmp_path / 'e', device='cpu', show=False)
        assert not (tmp_path / 'e' / 'experiment.json').exists()
    with pytest.raises(ValueError, match="shard must be"): run_experiment(preset('digits'), tmp_path / 'e', shard='x')
    assert not (tmp_path / 'e').exists()


def test_one_run_check_for_report_and_sweep(tmp_path, capsys):
    """One rule (`results.check_run`) for every reader and the sweep: a run retrained with another recipe name and the same
    `train_kwargs` (the paper's recipe instead of `fast`) is refused by both, naming it; so is a run whose record says it was
    measured with another protocol (another SSDC sample seed)."""
    from conftest import cli
    from pe_anchors.learner import train
    (tmp_path / 'cfg').mkdir()
    e, out = exp_file(tmp_path / 'cfg'), tmp_path / 'o'
    rc, err = cli(capsys, 'sweep', e, '--out', out, '--workers', '1', '--quiet')
    assert rc == 0, err
    exp = tiny()
    train('nope', _digits(exp), 'paper', run_dir=out / 'runs' / 'nope-s0' / 'train', seed=0, resume=False,
          show_progress=False, model_kwargs=exp.model_kwargs, **exp.train_kwargs)      # the same train_kwargs, recipe 'paper'
    refused = [cli(capsys, *argv) for argv in (('report', out), ('sweep', e, '--out', out, '--quiet'))]
    (rc, err), (rc2, err2) = refused
    assert rc == rc2 == 2 and err.split(': error: ')[1] == err2.split(': error: ')[1], refused   # one line, the same from both
    assert 'runs/nope-s0 was trained with another setting than this experiment' in err and 'recipe.' in err, err
    train('nope', _digits(exp), exp.recipe, run_dir=out / 'runs' / 'nope-s0' / 'train', seed=0, resume=False,
          show_progress=False, model_kwargs=exp.model_kwargs, **exp.train_kwargs)      # its own recipe again: read
    rc, err = cli(capsys, 'report', out)
    assert rc == 0, err
    rec = out / 'runs' / 'ape-s0' / 'run.json'
    r = json.loads(rec.read_text()); r['protocol']['sample_seed'] = 7; rec.write_text(json.dumps(r))
    refused = [cli(capsys, *argv) for argv in (('report', out), ('sweep', e, '--out', out, '--quiet'))]
    (rc, err), (rc2, err2) = refused
    assert rc == rc2 == 2 and err.split(': error: ')[1] == err2.split(': error: ')[1], refused
    assert 'runs/ape-s0 was measured with another protocol' in err and 'sample_seed 7 against 0' in err, err


def _digits(exp):
    from pe_anchors.data import get_data
    return get_data(exp.data, **exp.data_kwargs)
