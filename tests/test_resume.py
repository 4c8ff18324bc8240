"""Resuming: a run killed at any point continues from its checkpoint to the weights of an uninterrupted run; what a
killed or crashed job leaves behind (torn checkpoints, final files or metrics, temporary files) is recovered from or
named; a finished run or sweep is not trained again."""
import csv, json, warnings

import pytest
import torch
import pandas as pd

import pe_anchors  # noqa: F401
from pe_anchors.learner import pe_learner, fit_recipe, train
from pe_anchors.rundir import TrainDir
from pe_anchors.sweep import run_experiment, run_dir_of
from pe_anchors.core import read_json
from pe_anchors.kept import load_run_model

from conftest import FAST, stop_after, weights, fake_run, tiny, tiny_two_conditions


def weights_of(res): return weights(res['learn'].model)


state_of = weights


def trained_weights(out): return weights(out['learn'].model)


@pytest.mark.parametrize('condition', ['rpt'])
def test_interrupted_run_resumes_to_identical_weights(tmp_path, small, condition):
    kw = dict(epochs=3, **FAST)
    full = train(condition, small, run_dir=tmp_path / 'full', **kw)
    with pytest.raises(KeyboardInterrupt):
        train(condition, small, run_dir=tmp_path / 'cut', cbs=[stop_after(1)], **kw)
    assert TrainDir(tmp_path / 'cut').last_checkpoint().name == 'epoch_001'
    assert not (tmp_path / 'cut' / 'final.json').exists()
    resumed = train(condition, small, run_dir=tmp_path / 'cut', **kw)
    assert resumed['learn'].run_recorder.start_epoch == 2                       # from the checkpoint, not from scratch
    wf, wr = weights_of(full), weights_of(resumed)
    assert all(torch.equal(wf[k], wr[k]) for k in wf)
    rows = lambda p: [{k: v for k, v in r.items() if k not in ('time_s', 'train_img_s')}
                      for r in csv.DictReader(open(p / 'metrics.csv'))]
    assert rows(tmp_path / 'cut') == rows(tmp_path / 'full') and len(rows(tmp_path / 'full')) == 3
    assert resumed['accuracy'] == full['accuracy']
    # a finished run is not trained again: its final weights are loaded
    again = train(condition, small, run_dir=tmp_path / 'cut', **kw)
    assert all(torch.equal(wf[k], v) for k, v in weights_of(again).items())


def test_resume_refuses_a_different_run(tmp_path, small):
    train('ape', small, run_dir=tmp_path, epochs=1, **FAST)
    with pytest.raises(ValueError, match=r"different run \(differs in \['condition', 'pe'\]\)"):
        pe_learner(small, 'rope', run_dir=tmp_path, epochs=1, **FAST)
    pe_learner(small, 'rope', run_dir=tmp_path, resume=False, epochs=1, **FAST)   # explicit restart is allowed


def test_restart_clears_old_results(tmp_path, small):
    train('ape', small, run_dir=tmp_path, epochs=2, **FAST)
    learn = pe_learner(small, 'ape', run_dir=tmp_path, resume=False, epochs=1, **FAST)
    assert not (tmp_path / 'final.json').exists() and TrainDir(tmp_path).last_checkpoint() is None
    fit_recipe(learn)
    assert TrainDir(tmp_path).last_checkpoint().name == 'epoch_000'
    assert len(list(csv.DictReader(open(tmp_path / 'metrics.csv')))) == 1
    assert json.loads((tmp_path / 'final.json').read_text())['epochs'] == 1


@pytest.mark.parametrize('damage', ['missing', 'extra'])
def test_a_checkpoint_that_does_not_fit_the_model_falls_back(small, tmp_path, damage):
    from safetensors.torch import load_file, save_file
    full = train('ape', small, run_dir=tmp_path / 'full', epochs=3, **FAST)
    run = tmp_path / 'cut'
    with pytest.raises(KeyboardInterrupt): train('ape', small, run_dir=run, epochs=3, cbs=[stop_after(1)], **FAST)
    f = TrainDir(run).checkpoint_files(TrainDir(run).checkpoints()[-1])[0]
    sd = load_file(str(f))
    if damage == 'missing': sd.pop('head.bias')
    else: sd['stray.weight'] = torch.zeros(3)
    save_file(sd, str(f))
    with pytest.warns(UserWarning, match=f"epoch_001 does not fit the model \\({damage} key.*older one"):
        resumed = train('ape', small, run_dir=run, epochs=3, **FAST)
    assert resumed['learn'].run_recorder.start_epoch == 1                                  # from epoch_000
    wf, wr = state_of(full['learn'].model), state_of(resumed['learn'].model)
    assert all(torch.equal(wf[k], wr[k]) for k in wf)


def test_a_torn_final_model_is_rebuilt_from_the_last_checkpoint(small, tmp_path):
    from pe_anchors.hub import load_checkpoint
    run = tmp_path / 'run'
    out = train('ape', small, run_dir=run, epochs=2, **FAST)
    want = state_of(out['learn'].model)
    f = run / 'model.safetensors'
    f.write_bytes(f.read_bytes()[:1000])                                        # torn
    with pytest.warns(UserWarning, match=r'model.safetensors.*rebuilt from .*epoch_001'):
        again = train('ape', small, run_dir=run, epochs=2, **FAST)
    got = state_of(load_checkpoint(f))
    assert all(torch.equal(want[k], got[k]) for k in want) and again['epochs'] == 2


def test_an_emptied_metrics_csv_is_restored_on_resume(small, tmp_path):
    import csv
    run = tmp_path / 'run'
    with pytest.raises(KeyboardInterrupt): train('ape', small, run_dir=run, epochs=3, cbs=[stop_after(1)], **FAST)
    before = list(csv.DictReader((run / 'metrics.csv').open()))
    (run / 'metrics.csv').write_text('')
    with pytest.warns(UserWarning, match=r'metrics.csv.*epochs 0\.\.1.*restored'):
        train('ape', small, run_dir=run, epochs=3, **FAST)
    after = list(csv.DictReader((run / 'metrics.csv').open()))
    assert [r['epoch'] for r in after] == ['0', '1', '2'] and after[:2] == before


def test_a_torn_newest_checkpoint_falls_back_to_the_previous_one(small, tmp_path):
    full = train('rpt', small, run_dir=tmp_path / 'full', epochs=4, **FAST)
    with pytest.raises(KeyboardInterrupt): train('rpt', small, run_dir=tmp_path / 'cut', epochs=4, cbs=[stop_after(2)], **FAST)
    newest = TrainDir(tmp_path / 'cut').last_checkpoint()
    assert newest.name == 'epoch_002' and len(TrainDir(tmp_path / 'cut').checkpoints()) == 2
    (newest / 'state.pt').write_bytes((newest / 'state.pt').read_bytes()[:100])           # killed mid-write
    with warnings.catch_warnings(): warnings.simplefilter('ignore'); resumed = train('rpt', small, run_dir=tmp_path / 'cut', epochs=4, **FAST)
    assert resumed['learn'].run_recorder.start_epoch == 2                                  # from epoch_001, the previous good one
    wf, wr = trained_weights(full), trained_weights(resumed)
    assert all(torch.equal(wf[k], wr[k]) for k in wf)                          # and bit-identical to the uninterrupted run


def test_a_zero_byte_final_json_is_rebuilt(small, tmp_path):
    run = tmp_path / 'run'
    train('ape', small, run_dir=run, epochs=1, **FAST)
    (run / 'final.json').write_text('')
    with warnings.catch_warnings(): warnings.simplefilter('ignore'); out = train('ape', small, run_dir=run, epochs=1, **FAST)
    assert 0 <= out['accuracy'] <= 1 and read_json(run / 'final.json')['epochs'] == 1


def test_a_torn_metrics_line_is_named(small, tmp_path):
    run = tmp_path / 'run'
    with pytest.raises(KeyboardInterrupt): train('ape', small, run_dir=run, epochs=3, cbs=[stop_after(1)], **FAST)
    m = run / 'metrics.csv'
    m.write_text(m.read_text() + '2,1.2')                                      # a torn line
    with pytest.raises(ValueError, match='metrics.csv is torn'): train('ape', small, run_dir=run, epochs=3, **FAST)


def test_leftovers_of_killed_writers_are_removed_at_the_next_start(tmp_path):
    from pe_anchors.data import digits
    from pe_anchors.learner import train
    import dataclasses
    from pe_anchors.data import ImageSplit
    d = digits()
    small = dataclasses.replace(d, train=ImageSplit(d.train.labels[:128], images=d.train.images[:128]),
                                valid=ImageSplit(d.valid.labels[:32], images=d.valid.images[:32]))
    run = tmp_path / 'run'
    train('ape', small, run_dir=run, epochs=1, bs=64, model_kwargs=dict(depth=1), show_progress=False)
    planted = [run / 'checkpoints' / '.tmp_epoch_001_k1l2m3n4', run / '.config.json.a1b2c3d4.tmp',
               run / '.model.safetensors.c3d4e5f6.tmp', run / 'checkpoints' / '.tmp_epoch_000_zz_9y8x7']
    planted[0].mkdir(); (planted[0] / 'state.pt').write_bytes(b'x'); planted[3].mkdir()
    for p in planted[1:3]: p.write_bytes(b'half')
    keep = [run / 'notes.tmp', run / '.cache.tmp']                             # not names the library writes
    for k in keep: k.write_text('mine')
    train('ape', small, run_dir=run, epochs=1, bs=64, model_kwargs=dict(depth=1), show_progress=False)
    assert not any(p.exists() for p in planted) and all(k.exists() for k in keep)
    # the same in an experiment directory and its run folders
    exp = tiny()
    for c, s in exp.runs(): fake_run(tmp_path / 'exp', exp, c, s)
    (tmp_path / 'exp' / 'experiment.json').write_text(json.dumps(exp.to_dict()))
    planted = [tmp_path / 'exp' / '.results.csv.q1w2e3r4.tmp', tmp_path / 'exp' / 'runs' / 'ape-s0' / '.run.json.q2w3e4r5.tmp',
               tmp_path / 'exp' / 'runs' / 'nope-s0' / '.results.csv.q3w4e5r6.tmp']
    for p in planted: p.write_bytes(b'half')
    run_experiment(exp, tmp_path / 'exp', device='cpu', show=False)
    assert not any(p.exists() for p in planted)


def test_run_experiment_resumes_and_skips(tmp_path, digits):
    exp = tiny_two_conditions()
    df = run_experiment(exp, tmp_path, show=False, data=digits, device='cpu')
    assert set(df['condition']) == {'nope', 'ape'} and set(df['stage']) == {'trained', 'untrained'}
    assert (tmp_path / 'results.csv').exists() and json.loads((tmp_path / 'experiment.json').read_text()) == exp.to_dict()
    # a finished run is not retrained: its results file is reused as is
    stamp = (run_dir_of(tmp_path, 'ape', 0) / 'results.csv').stat().st_mtime_ns
    df2 = run_experiment(exp, tmp_path, show=False, data=digits, device='cpu')
    assert (run_dir_of(tmp_path, 'ape', 0) / 'results.csv').stat().st_mtime_ns == stamp
    pd.testing.assert_frame_equal(df, df2)
    # a run killed after training but before its evaluation is evaluated (not retrained) on the next call
    (run_dir_of(tmp_path, 'nope', 0) / 'results.csv').unlink()
    ck = run_dir_of(tmp_path, 'nope', 0) / 'train' / 'model.safetensors'
    before = ck.stat().st_mtime_ns
    df3 = run_experiment(exp, tmp_path, show=False, data=digits, device='cpu')
    assert ck.stat().st_mtime_ns == before
    cols = ['condition', 'stage', 'metric', 'mode', 'layer', 'shift', 'severity', 'alpha']
    key = lambda d: d.sort_values(cols).reset_index(drop=True)[cols + ['value']]
    pd.testing.assert_frame_equal(key(df3), key(df))
    assert load_run_model(tmp_path, 'ape').pe == 'ape'
    with pytest.raises(ValueError, match='holds a different experiment'): run_experiment(tiny_two_conditions(n_perms=3), tmp_path, data=digits)
