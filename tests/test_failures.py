"""Silent wrong answers, lost data, stuck states and code run from a file: each case now either survives or stops with
a message naming what is wrong (issue 24, section 1). Every test here failed on the code before the fix."""
import dataclasses, json, os, shutil, subprocess, sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import pe_anchors  # noqa: F401
from pe_anchors.core import RunLock
from pe_anchors.data import ImageSplit, cifar10, decode_file, image_folder
from pe_anchors.experiment import (EvalData, Experiment, evaluate_model, preset, resolve_shard,
                                   run_experiment)
from pe_anchors.learner import checkpoints, make_callbacks, pe_learner, train
from pe_anchors.results import concat_results, gather, load_results, read_results

from conftest import FAST, fake_run, stop_after, weights

ROOT = Path(__file__).resolve().parents[1]


_weights = weights


# ---------------------------------------------------------------- runs checked by every reader of a directory
def tiny(**kw):
    base = dict(conditions=['ape', 'nope'], seeds=[0, 1], train_kwargs=dict(epochs=1), ssdc_images=32, n_perms=1,
                alphas=[], model_kwargs=dict(depth=2))
    return preset('digits', **{**base, **kw})


def test_every_reader_checks_each_run_against_the_experiment(tmp_path):
    from pe_anchors.report import write_report
    exp = tiny()
    (tmp_path / 'experiment.json').write_text(json.dumps(exp.to_dict()))
    fake_run(tmp_path, exp, 'ape', 0)
    fake_run(tmp_path, exp, 'nope', 0)
    assert len(gather(tmp_path, write=False)) == 4                              # the experiment's own runs pass
    fake_run(tmp_path, exp, 'ape', 1, lr=5e-3, epochs=3)                        # copied in from another experiment
    for read in (lambda: gather(tmp_path), lambda: load_results(tmp_path), lambda: write_report(tmp_path)):
        with pytest.raises(ValueError, match=r"runs/ape-s1.*(recipe\.epochs|recipe\.lr)"): read()
    assert not (tmp_path / 'results.csv').exists() and not (tmp_path / 'report').exists()


def test_runs_of_another_experiment_or_outside_its_grid_are_refused(tmp_path):
    exp = tiny(seeds=[0])
    (tmp_path / 'experiment.json').write_text(json.dumps(exp.to_dict()))
    fake_run(tmp_path, exp, 'ape', 0)
    fake_run(tmp_path, exp, 'nope', 3)                                          # a seed this experiment never ran
    with pytest.raises(ValueError, match=r"runs/nope-s3.*seed 3 .*not one of the experiment's seeds"): gather(tmp_path)
    shutil.rmtree(tmp_path / 'runs' / 'nope-s3')
    fake_run(tmp_path, exp, 'nope', 0, name='other')                            # rows written by another experiment
    with pytest.raises(ValueError, match=r"runs/nope-s0.*experiment 'other'"): gather(tmp_path)


def test_runs_written_before_these_checks_are_read(tmp_path):
    "An experiment.json of the earlier format (no rpi_mode / callbacks) and its runs read as before."
    exp = tiny()
    old = {k: v for k, v in exp.to_dict().items() if k not in ('rpi_mode', 'callbacks', 'shift_ref_size')}
    (tmp_path / 'experiment.json').write_text(json.dumps(old))
    for c, s in exp.runs(): fake_run(tmp_path, exp, c, s)
    df = gather(tmp_path, write=False)
    assert sorted(df['seed'].unique()) == [0, 1] and len(df) == 8


def test_result_tables_of_one_experiment_over_seeds_combine():
    "The committed tables read back whole, and a table of other seeds of the same experiment joins them."
    for p in sorted((ROOT / 'nbs' / 'results').glob('*/results.csv')):
        df = read_results(p)
        assert len(df) > 0 and df['seed'].dtype.kind == 'i' and df['value'].dtype.kind == 'f', p
    committed = read_results(ROOT / 'nbs' / 'results' / 'cifar10-cpu' / 'results.csv')
    seed0 = committed[committed['seed'] == 0]
    more = pd.concat([seed0.assign(seed=7), seed0.assign(seed=8)], ignore_index=True)
    both = concat_results({'committed': committed, 'new': more})
    assert set(both['seed']) == set(committed['seed']) | {7, 8} and len(both) == len(committed) + 2 * len(seed0)
    with pytest.raises(ValueError, match='duplicate result rows'):                # the same seed twice is refused
        concat_results({'committed': committed, 'again': seed0})


# ---------------------------------------------------------------- no code from an experiment file
def test_an_experiment_file_names_registered_callbacks_only(tmp_path):
    for cb in ('sys:exit', 'os:getpid', 'fastai.callback.progress:CSVLogger'):
        with pytest.raises(ValueError, match=f"callback {cb!r}.*registered.*--cbs"): Experiment(callbacks=[cb])
        f = tmp_path / 'e.json'
        f.write_text(json.dumps(dict(name='x', callbacks=[cb])))
        with pytest.raises(ValueError, match='registered'): Experiment.load(f)
        with pytest.raises(ValueError, match='registered'): run_experiment(str(f), tmp_path / 'out')
        assert not (tmp_path / 'out').exists()                                  # nothing written, no lock left
    assert Experiment(callbacks=['csv']).callbacks == ['csv']


def test_callbacks_by_module_path_are_checked_fastai_callbacks():
    with pytest.raises(ValueError, match="'os:getpid' is not a fastai Callback"): make_callbacks(['os:getpid'], allow_import=True)
    with pytest.raises(ValueError, match="'sys:exit' is not a fastai Callback"): make_callbacks(['sys:exit'], allow_import=True)
    with pytest.raises(ValueError, match='registered'): make_callbacks(['fastai.callback.progress:CSVLogger'])
    from fastai.callback.progress import CSVLogger
    assert isinstance(make_callbacks(['fastai.callback.progress:CSVLogger'], allow_import=True)[0], CSVLogger)


def test_cbs_from_the_command_line_reach_every_run(tmp_path, monkeypatch):
    import pe_anchors.experiment as E
    from pe_anchors.cli import main
    seen = {}
    def fake(exp, out, **kw):
        from pe_anchors.results import RESULT_COLUMNS
        seen.update(exp=exp, **kw); return pd.DataFrame(columns=RESULT_COLUMNS)       # the table's schema, no runs
    monkeypatch.setattr(E, 'run_experiment', fake)
    assert main(['sweep', 'digits', '--out', str(tmp_path), '--cbs', 'csv', 'fastai.callback.progress:CSVLogger', '--quiet']) == 0
    assert seen['exp'].callbacks == ['csv'] and seen['extra_callbacks'] == ['fastai.callback.progress:CSVLogger']


# ---------------------------------------------------------------- --restart takes the directory's lock
def test_restart_waits_for_the_runs_it_would_delete(tmp_path):
    exp = tiny(seeds=[0])
    (tmp_path / 'experiment.json').write_text(json.dumps(exp.to_dict()))
    run = fake_run(tmp_path, exp, 'ape', 0)
    (run / 'results.csv').unlink(); (run / 'results.csv.sha256').unlink()        # a run in progress
    probe = (f"from pe_anchors.core import RunLock; import time\n"
             f"with RunLock({str(run)!r}) as l: print(l.acquired, flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, '-c', probe], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == 'True'
        with pytest.raises(ValueError, match=r'another process.*ape-s0.*--restart'):
            run_experiment(exp, tmp_path, restart=True, device='cpu', show=False)
        assert (run / 'train' / 'config.json').exists() and (tmp_path / 'experiment.json').exists()   # nothing deleted
    finally: holder.kill(); holder.wait()


def test_restart_is_refused_while_a_sweep_holds_the_directory(tmp_path):
    exp = tiny(seeds=[0])
    (tmp_path / 'experiment.json').write_text(json.dumps(exp.to_dict()))
    fake_run(tmp_path, exp, 'ape', 0)
    probe = (f"from pe_anchors.core import RunLock; import time\n"
             f"with RunLock({str(tmp_path)!r}, shared=True) as l: print(l.acquired, flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, '-c', probe], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == 'True'
        with pytest.raises(ValueError, match=r'another sweep.*--restart'):
            run_experiment(exp, tmp_path, restart=True, device='cpu', show=False)
        assert (tmp_path / 'runs' / 'ape-s0' / 'results.csv').exists()
        with RunLock(tmp_path, shared=True) as lk: assert lk.acquired           # two sweeps (shards) share it
    finally: holder.kill(); holder.wait()


# ---------------------------------------------------------------- Slurm arrays and torchrun ranks
@pytest.mark.parametrize('first', [0, 1, 5])
def test_slurm_arrays_from_any_first_index_cover_every_run(monkeypatch, first):
    monkeypatch.delenv('WORLD_SIZE', raising=False)
    runs = tiny(conditions=['ape', 'nope', 'spe'], seeds=[0, 1]).runs()
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
    runs = tiny(conditions=['ape', 'nope', 'spe']).runs()
    got = []
    for rank in range(4):
        monkeypatch.setenv('WORLD_SIZE', '4'); monkeypatch.setenv('RANK', str(rank)); monkeypatch.setenv('LOCAL_RANK', str(rank))
        i, n, local = resolve_shard('auto')
        assert (i, n, local) == (rank, 4, rank) and os.environ['WORLD_SIZE'] == '1'   # no DDP inside a run
        got += runs[i::n]
    assert sorted(got) == sorted(runs)
    monkeypatch.setenv('WORLD_SIZE', '4'); monkeypatch.setenv('RANK', '4')
    with pytest.raises(ValueError, match=r'RANK=4.*0\.\.3'): resolve_shard('auto')


# ---------------------------------------------------------------- checkpoints that do not fit, torn final weights
@pytest.mark.parametrize('damage', ['missing', 'extra'])
def test_a_checkpoint_that_does_not_fit_the_model_falls_back(small, tmp_path, damage):
    from safetensors.torch import load_file, save_file
    full = train('ape', small, run_dir=tmp_path / 'full', epochs=3, **FAST)
    run = tmp_path / 'cut'
    with pytest.raises(KeyboardInterrupt): train('ape', small, run_dir=run, epochs=3, cbs=[stop_after(1)], **FAST)
    f = checkpoints(run)[-1] / 'model.safetensors'
    sd = load_file(str(f))
    if damage == 'missing': sd.pop('head.bias')
    else: sd['stray.weight'] = torch.zeros(3)
    save_file(sd, str(f))
    with pytest.warns(UserWarning, match=f"epoch_001 does not fit the model \\({damage} key.*older one"):
        resumed = train('ape', small, run_dir=run, epochs=3, **FAST)
    assert resumed['learn'].resume_epoch == 1                                  # from epoch_000
    wf, wr = _weights(full['learn'].model), _weights(resumed['learn'].model)
    assert all(torch.equal(wf[k], wr[k]) for k in wf)


def test_a_torn_final_model_is_rebuilt_from_the_last_checkpoint(small, tmp_path):
    from pe_anchors.vit import load_checkpoint
    run = tmp_path / 'run'
    out = train('ape', small, run_dir=run, epochs=2, **FAST)
    want = _weights(out['learn'].model)
    f = run / 'model.safetensors'
    f.write_bytes(f.read_bytes()[:1000])                                        # torn
    with pytest.warns(UserWarning, match=r'model.safetensors.*rebuilt from .*epoch_001'):
        again = train('ape', small, run_dir=run, epochs=2, **FAST)
    got = _weights(load_checkpoint(f))
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


def test_divergence_without_a_run_directory_warns(small):
    with pytest.warns(UserWarning, match='training diverged at epoch 0'):
        train('ape', small, epochs=1, lr=1e6, **FAST)


# ---------------------------------------------------------------- data that does not fit the model
def test_out_of_range_labels_are_refused_at_load(small, tmp_path):
    with pytest.raises(ValueError, match=r'valid labels .*12.*outside 0\.\.9'):
        dataclasses.replace(small, valid=ImageSplit(torch.full((4,), 12), images=small.valid.images[:4]))
    with pytest.raises(ValueError, match=r'train labels .*-1'):
        dataclasses.replace(small, train=ImageSplit(torch.full((4,), -1), images=small.train.images[:4]))
    from torchvision.io import encode_jpeg
    jpg = [encode_jpeg(small.train.images[i]).numpy() for i in range(6)]
    off = np.cumsum([0] + [len(j) for j in jpg])
    np.savez(tmp_path / 'c.npz', train_jpeg=np.concatenate(jpg), train_offsets=off, train_labels=np.array([0, 1, 2, 3, 4, 10]),
             val_jpeg=np.concatenate(jpg), val_offsets=off, val_labels=np.arange(6), classes=np.array([str(i) for i in range(10)]))
    with pytest.raises(ValueError, match=r'train labels .*10.*outside 0\.\.9'): cifar10(tmp_path / 'c.npz')


def test_a_model_of_another_class_count_is_refused(small):
    two = dataclasses.replace(small, classes=['0', '1'],
                              train=ImageSplit(small.train.labels[small.train.labels < 2], images=small.train.images[small.train.labels < 2]),
                              valid=ImageSplit(small.valid.labels[small.valid.labels < 2], images=small.valid.images[small.valid.labels < 2]))
    model = pe_learner(small, 'ape', **FAST).model                             # 10 classes
    ev = EvalData(two, 8, 32, 'cpu')
    with pytest.raises(ValueError, match=r'10 classes.*2 classes'): evaluate_model(model, ev, tiny(), 'ape')


def test_analyze_takes_the_condition_from_the_checkpoint(tmp_path, capsys):
    import timm
    from pe_anchors.cli import main
    from pe_anchors.vit import save_checkpoint
    save_checkpoint(timm.create_model('pe_vit_nano_patch2_16', pe='rope', num_classes=10), tmp_path / 'rope.safetensors')
    args = ['analyze', str(tmp_path / 'rope.safetensors'), '--ssdc-images', '16', '--n-perms', '1', '--device', 'cpu']
    assert main(args + ['--condition', 'ape', '--out', str(tmp_path / 'a')]) == 2
    err = capsys.readouterr().err
    assert "--condition ape" in err and "rope" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / 'a' / 'analysis.csv').exists()
    assert main(args + ['--out', str(tmp_path / 'b')]) == 0
    assert set(pd.read_csv(tmp_path / 'b' / 'analysis.csv')['condition']) == {'rope'}


# ---------------------------------------------------------------- image folders
def _folder(root: Path, classes, n=2, splits=('train', 'val')):
    from PIL import Image
    for s in splits:
        for ci, c in enumerate(classes):
            (root / s / c).mkdir(parents=True, exist_ok=True)
            for i in range(n): Image.new('RGB', (10, 10), (30 * i, 40 * ci, 90)).save(root / s / c / f'{i}.png')


@pytest.mark.parametrize('in_memory', [True, False])
def test_a_16_bit_png_loads(tmp_path, in_memory):
    from PIL import Image
    _folder(tmp_path, ['a', 'b'])
    v = (np.arange(100, dtype=np.uint16).reshape(10, 10) * 650)                 # 0..64350 over the 16-bit range
    deep = tmp_path / 'train' / 'b' / 'deep.png'
    Image.fromarray(v).save(deep)
    assert Image.open(deep).mode == 'I;16'
    want = torch.from_numpy(np.round(v / 257.).astype(np.uint8))                # 65535 -> 255
    x = decode_file(deep)
    assert x.dtype == torch.uint8 and x.shape == (3, 10, 10) and all(torch.equal(x[c], want) for c in range(3))
    data = image_folder(tmp_path, img_size=10, in_memory=in_memory)
    assert len(data.train) == 5
    if in_memory: got, label = data.train.images[4], data.train.labels[4]    # a/0, a/1, b/0, b/1, b/deep
    else: got, label = data.dls(bs=5, device='cpu', num_workers=0, aug='none').train.dataset[data.train.files.index(str(deep))]
    assert torch.equal(got[0], want) and int(label) == 1


def test_an_undecodable_image_names_its_file(tmp_path):
    (tmp_path / 'x.png').write_bytes(b'\x89PNG\r\n\x1a\nbroken')
    with pytest.raises(ValueError, match=r'x\.png'): decode_file(tmp_path / 'x.png')


def test_an_empty_or_missing_class_folder_is_named(tmp_path):
    _folder(tmp_path, ['cat', 'dog', 'eel'])
    for f in (tmp_path / 'train' / 'dog').iterdir(): f.unlink()
    with pytest.raises(ValueError, match=r"train.*'dog'.*no image"): image_folder(tmp_path, img_size=8)
    _folder(tmp_path, ['dog'], splits=('train',))
    shutil.rmtree(tmp_path / 'val' / 'eel')
    with pytest.raises(ValueError, match=r"'eel'.*no folder in .*val"): image_folder(tmp_path, img_size=8)
    (tmp_path / 'val' / 'eel').mkdir()
    with pytest.raises(ValueError, match=r"val.*'eel'.*no image"): image_folder(tmp_path, img_size=8, in_memory=False)


def test_analyze_measures_a_peg_with_another_padding(tmp_path, capsys):
    "`analyze --padding circular` gives the rows `peg_padding` gives in Python, tagged; a model without a PEG is refused."
    import timm
    from pe_anchors.cli import main
    from pe_anchors.data import get_data
    from pe_anchors.interventions import peg_padding
    from pe_anchors.vit import save_checkpoint
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
