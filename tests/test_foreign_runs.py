"""An experiment holds its own runs only: every reader checks each run against the experiment and the others (setting,
grid, measurement, names, copies), tables of two datasets are not averaged, and files of an earlier format are read
with their defaults."""
import json, shutil
from pathlib import Path

import pandas as pd
import pytest

import pe_anchors  # noqa: F401
from pe_anchors.config import Experiment, preset
from pe_anchors.learner import train
from pe_anchors.results import gather, load_results, result_frame, write_results
from pe_anchors.sweep import check_run

from conftest import fake_run, cli, exp_file, tiny, tiny_two_seeds


def _measured_with(d: Path, exp, cond: str, seed: int, n_images: int, n_perms: int):
    "Rewrite run (cond, seed)'s results as if measured over `n_images` SSDC images and `n_perms` RPI draws."
    rows = [dict(metric='acc', shift='clean', value=.5, n_images=360),
            dict(metric='ssdc', mode='normal', layer=0, value=.3, n_perms=0, n_images=n_images),
            dict(metric='ssdc', mode='rpi', layer=0, value=.1, n_perms=n_perms, n_images=n_images)]
    write_results(result_frame(rows, experiment=exp.name, dataset='digits', condition=cond, seed=seed),
                  d / 'runs' / f'{cond}-s{seed}' / 'results.csv')


def test_every_reader_checks_each_run_against_the_experiment(tmp_path):
    from pe_anchors.report import write_report
    exp = tiny_two_seeds()
    (tmp_path / 'experiment.json').write_text(json.dumps(exp.to_dict()))
    fake_run(tmp_path, exp, 'ape', 0)
    fake_run(tmp_path, exp, 'nope', 0)
    assert len(gather(tmp_path, write=False)) == 4                              # the experiment's own runs pass
    fake_run(tmp_path, exp, 'ape', 1, lr=5e-3, epochs=3)                        # copied in from another experiment
    for read in (lambda: gather(tmp_path), lambda: load_results(tmp_path), lambda: write_report(tmp_path)):
        with pytest.raises(ValueError, match=r"runs/ape-s1.*(recipe\.epochs|recipe\.lr)"): read()
    assert not (tmp_path / 'results.csv').exists() and not (tmp_path / 'report').exists()


def test_runs_of_another_experiment_or_outside_its_grid_are_refused(tmp_path):
    exp = tiny_two_seeds(seeds=[0])
    (tmp_path / 'experiment.json').write_text(json.dumps(exp.to_dict()))
    fake_run(tmp_path, exp, 'ape', 0)
    fake_run(tmp_path, exp, 'nope', 3)                                          # a seed this experiment never ran
    with pytest.raises(ValueError, match=r"runs/nope-s3.*seed 3 .*not one of the experiment's seeds"): gather(tmp_path)
    shutil.rmtree(tmp_path / 'runs' / 'nope-s3')
    fake_run(tmp_path, exp, 'nope', 0, name='other')                            # rows written by another experiment
    with pytest.raises(ValueError, match=r"runs/nope-s0.*experiment 'other'"): gather(tmp_path)


def test_a_run_from_another_experiment_is_refused(small, tmp_path):
    exp = preset('digits', conditions=['ape'], train_kwargs=dict(epochs=1, bs=64))
    train('ape', small, run_dir=tmp_path / 'ape-s0' / 'train', epochs=1, bs=64, lr=5e-3, show_progress=False)   # other lr
    with pytest.raises(ValueError, match=r"trained with another setting than this experiment \(differs in .*recipe\.lr"):
        check_run(exp, tmp_path / 'ape-s0')


def test_gather_refuses_torn_duplicated_and_foreign_runs(tmp_path):
    for c in ('ape', 'nope'):
        write_results(result_frame([dict(metric='acc', value=.5)], condition=c), tmp_path / 'runs' / f'{c}-s0' / 'results.csv')
    assert len(gather(tmp_path)) == 2
    f = tmp_path / 'runs' / 'ape-s0' / 'results.csv'
    good = f.read_bytes(); f.write_bytes(good[:-5])
    with pytest.raises(ValueError, match=r'ape-s0/results.csv does not match its checksum'): gather(tmp_path)
    f.write_bytes(good)
    write_results(result_frame([dict(metric='acc', value=.5)], condition='ape'), tmp_path / 'runs' / 'ape-copy' / 'results.csv')
    with pytest.raises(ValueError, match='duplicate result rows.*ape-copy'): gather(tmp_path)


def test_a_duplicated_run_folder_is_named(tmp_path, capsys):
    write_results(result_frame([dict(metric='acc', value=.5)], condition='nope'), tmp_path / 'runs' / 'nope-s0' / 'results.csv')
    write_results(result_frame([dict(metric='acc', value=.5, sweep='alpha')], condition='ape'),
                  tmp_path / 'runs' / 'ape-s0' / 'results.csv')
    shutil.copytree(tmp_path / 'runs' / 'nope-s0', tmp_path / 'runs' / 'nope-s0 (copy)')
    with pytest.raises(ValueError, match=r'duplicate result rows.*runs/nope-s0 \(copy\)'): gather(tmp_path)
    rc, err = cli(capsys, 'report', tmp_path)
    assert rc == 2 and 'nope-s0 (copy)' in err, err


def test_a_run_measured_with_other_settings_is_refused(tmp_path, capsys):
    from pe_anchors.results import check_runs
    from pe_anchors.study import padding_study, run_study, signal_ratio_study
    exp = tiny()                                                       # 32 SSDC images, 1 permutation draw
    (tmp_path / 'experiment.json').write_text(json.dumps(exp.to_dict()))
    for c, s in exp.runs(): fake_run(tmp_path, exp, c, s)
    for c, s in exp.runs(): _measured_with(tmp_path, exp, c, s, 32, 1)
    gather(tmp_path)                                                   # the experiment's own settings: read
    _measured_with(tmp_path, exp, 'nope', 0, 64, 2)                    # copied in: same training, other measurement
    for call in (lambda: gather(tmp_path), lambda: check_runs(tmp_path), lambda: run_study(signal_ratio_study(), tmp_path),
                 lambda: run_study(padding_study(), tmp_path)):
        with pytest.raises(ValueError, match=r'runs/nope-s0 was measured with other settings.*n_perms 2.*n_perms: 1'): call()
    (tmp_path / 'cfg').mkdir()
    for argv in (('report', tmp_path), ('sweep', exp_file(tmp_path / 'cfg'), '--out', tmp_path, '--quiet')):
        rc, err = cli(capsys, *argv)
        assert rc == 2 and 'runs/nope-s0 was measured with other settings' in err and 'n_images 64' in err, err


def test_two_datasets_in_one_table(tmp_path, capsys):
    from pe_anchors.testing import synthetic_results
    a = synthetic_results(seeds=(0,))
    b = a.assign(dataset='cifar10')
    write_results(pd.concat([a, b], ignore_index=True), tmp_path / 'two.csv')
    rc, err = cli(capsys, 'report', tmp_path / 'two.csv', '--dest', tmp_path / 'rep')
    assert rc == 2 and '2 datasets' in err and 'cifar10' in err, err


def test_runs_of_an_earlier_format_are_read(tmp_path):
    "An experiment.json of the earlier format (no rpi_mode / callbacks) and its runs read as before."
    exp = tiny_two_seeds()
    old = {k: v for k, v in exp.to_dict().items() if k not in ('rpi_mode', 'callbacks', 'shift_ref_size')}
    (tmp_path / 'experiment.json').write_text(json.dumps(old))
    for c, s in exp.runs(): fake_run(tmp_path, exp, c, s)
    df = gather(tmp_path, write=False)
    assert sorted(df['seed'].unique()) == [0, 1] and len(df) == 8


def test_an_old_experiment_json_gets_the_defaults(tmp_path, capsys):
    exp = preset('digits', conditions=['ape'])
    old = {k: v for k, v in exp.to_dict().items() if k not in ('rpi_mode', 'callbacks')}
    (tmp_path / 'experiment.json').write_text(json.dumps(old))
    fake_run(tmp_path, exp, 'ape', 0)
    rc, err = cli(capsys, 'sweep', 'digits', '--conditions', 'ape', '--out', tmp_path, '--quiet')
    assert rc == 0, err
    assert json.loads((tmp_path / 'experiment.json').read_text())['rpi_mode'] == 'rpi'
    assert Experiment.load(tmp_path / 'experiment.json').rpi_mode == 'rpi'


def test_an_experiment_table_that_disagrees_with_its_runs_is_named(tmp_path, capsys):
    "Both readers of an experiment (its directory, its results.csv) read its runs and its table, and stop in one line when they differ."
    exp = tiny()
    (tmp_path / 'experiment.json').write_text(json.dumps(exp.to_dict()))
    for c, s in exp.runs(): fake_run(tmp_path, exp, c, s)
    gather(tmp_path)
    pd.testing.assert_frame_equal(load_results(tmp_path), load_results(tmp_path / 'results.csv'))
    fake_run(tmp_path, tiny(conditions=['ape', 'nope', 'rope']), 'rope', 0, name=exp.name)   # finished after the table
    (tmp_path / 'experiment.json').write_text(json.dumps(tiny(conditions=['ape', 'nope', 'rope']).to_dict()))
    for p in (tmp_path, tmp_path / 'results.csv'):
        with pytest.raises(ValueError, match=r'results.csv disagrees with the runs .*run\(s\) rope-s0 missing from the table'):
            load_results(p)
    rc, err = cli(capsys, 'report', tmp_path)
    assert rc == 2 and 'rope-s0 missing from the table' in err and 'gather' in err, err
    gather(tmp_path)                                                                       # written again from the runs
    assert set(load_results(tmp_path / 'results.csv')['condition']) == {'ape', 'nope', 'rope'}
