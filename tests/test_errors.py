"""Mistakes and accidents that lose nothing but used to end in a traceback or in a message naming nothing (issue 24,
section 2): each now gives one line that names the file, field or option, exit code 2 from the command line."""
import errno, json, os, pickle, re, shutil, subprocess, sys
from pathlib import Path

import pandas as pd
import pytest
import torch

import pe_anchors  # noqa: F401
from pe_anchors.cli import main
from pe_anchors.experiment import Experiment, preset, run_experiment
from pe_anchors.results import gather, result_frame, write_results

from conftest import fake_run


def cli(capsys, *args) -> tuple[int, str]:
    "Run the command line in this process: (exit code, its one stderr line); more than one line fails the test."
    try: rc = main([str(a) for a in args])
    except SystemExit as e: rc = e.code                                     # argparse's own usage errors
    lines = [l for l in capsys.readouterr().err.splitlines() if l.strip()]
    assert len(lines) <= 1 and not any('Traceback' in l for l in lines), lines
    return rc, lines[0] if lines else ''


def tiny(**kw):
    base = dict(conditions=['ape', 'nope'], seeds=[0], train_kwargs=dict(epochs=1), ssdc_images=32, n_perms=1, alphas=[],
                model_kwargs=dict(depth=2))
    return preset('digits', **{**base, **kw})


@pytest.fixture(scope='module')
def ckpt(tmp_path_factory):
    import timm
    from pe_anchors.vit import save_checkpoint
    p = tmp_path_factory.mktemp('ck') / 'ape.safetensors'
    return save_checkpoint(timm.create_model('pe_vit_nano_patch2_16', pe='ape', num_classes=10), p)


def test_an_error_inside_the_run_recorder_shows_its_reason(tmp_path, capsys):
    run = tmp_path / 'run'
    probe = (f"from pe_anchors.core import RunLock; import time\n"
             f"with RunLock({str(run)!r}) as l: print(l.acquired, flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, '-c', probe], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == 'True'
        rc, err = cli(capsys, 'train', '--out', run, '--epochs', '1', '--bs', '256', '--quiet')
    finally: holder.kill(); holder.wait()
    assert rc == 2 and 'is being trained by another process' in err and 'Exception occured' not in err, err


def test_restart_with_a_symlinked_runs_folder(tmp_path, capsys):
    out, elsewhere = tmp_path / 'exp', tmp_path / 'bigdisk' / 'runs'
    exp = tiny()
    fake_run(tmp_path / 'bigdisk', exp, 'ape', 0)
    out.mkdir(); (out / 'runs').symlink_to(elsewhere)
    rc, err = cli(capsys, 'sweep', 'digits', '--out', out, '--restart', '--epochs', '1', '--quiet')
    assert rc == 2 and 'runs' in err and 'symbolic link' in err, err
    assert (elsewhere / 'ape-s0' / 'results.csv').exists()                     # nothing deleted


def test_out_that_is_a_file(tmp_path, capsys, ckpt):
    f = tmp_path / 'taken'; f.write_text('x')
    for args in (('sweep', 'digits', '--out', f, '--quiet'), ('analyze', ckpt, '--out', f, '--quiet')):
        rc, err = cli(capsys, *args)
        assert rc == 2 and f'--out {f} is a file' in err, err


@pytest.mark.parametrize('text, msg', [('', 'is empty'), ('hello\n', "must hold a mapping of fields (name: value), got a str"),
                                        ('- ape\n- nope\n', 'got a list')])
def test_experiment_files_that_are_not_mappings(tmp_path, capsys, text, msg):
    f = tmp_path / 'e.yaml'; f.write_text(text)
    rc, err = cli(capsys, 'sweep', f, '--out', tmp_path / 'o')
    assert rc == 2 and str(f) in err and msg in err, err
    with pytest.raises(ValueError, match=re.escape(msg)): Experiment.load(f)


def test_a_results_csv_with_a_bad_value_names_file_line_and_column(tmp_path, capsys):
    t = result_frame([dict(metric='acc', value=.5), dict(metric='acc', shift='jpeg', value=.4)], condition='ape')
    p = tmp_path / 'r.csv'
    t.to_csv(p, index=False)
    p.write_text(p.read_text().replace(',ape,0,trained,acc,normal,-1,jpeg', ',ape,zero,trained,acc,normal,-1,jpeg'))
    rc, err = cli(capsys, 'report', p, '--dest', tmp_path / 'rep')
    assert rc == 2 and str(p) in err and "column seed" in err and 'line 3' in err and "'zero'" in err, err
    t.to_csv(p, index=False); p.write_text(p.read_text().replace('0.4', 'O.4'))
    rc, err = cli(capsys, 'report', p, '--dest', tmp_path / 'rep')
    assert rc == 2 and 'column value' in err and "'O.4'" in err, err


def test_a_torn_run_config_is_named(tmp_path, capsys):
    exp = tiny()
    (tmp_path / 'experiment.json').write_text(json.dumps(exp.to_dict()))
    for c, s in exp.runs(): fake_run(tmp_path, exp, c, s)
    cfg = tmp_path / 'runs' / 'nope-s0' / 'train' / 'config.json'
    cfg.write_text(cfg.read_text()[:40])
    rc, err = cli(capsys, 'report', tmp_path)
    assert rc == 2 and 'nope-s0/train/config.json is damaged' in err, err


def test_an_alpha_that_overflows_the_model_is_named(tmp_path, capsys, ckpt):
    rc, err = cli(capsys, 'analyze', ckpt, '--ssdc-images', '16', '--n-perms', '1', '--alphas', '1', '1e300',
                  '--device', 'cpu', '--out', tmp_path, '--quiet')
    assert rc == 2 and 'α = 1e+300' in err, err
    rc, err = cli(capsys, 'analyze', ckpt, '--alphas', 'inf', '--out', tmp_path)
    assert rc == 2 and 'α' in err, err


def test_analyze_on_a_full_disk_leaves_no_empty_table(tmp_path, capsys, ckpt, monkeypatch):
    def full(*a): raise OSError(errno.ENOSPC, 'No space left on device')
    monkeypatch.setattr(os, 'fsync', full)
    rc, err = cli(capsys, 'analyze', ckpt, '--ssdc-images', '16', '--n-perms', '1', '--device', 'cpu', '--out', tmp_path,
                  '--quiet')
    assert rc == 2 and 'No space left on device' in err and not (tmp_path / 'analysis.csv').exists(), err
    assert not list(tmp_path.glob('.*.tmp'))


def test_an_old_experiment_json_gets_the_defaults(tmp_path, capsys):
    exp = preset('digits', conditions=['ape'])
    old = {k: v for k, v in exp.to_dict().items() if k not in ('rpi_mode', 'callbacks')}
    (tmp_path / 'experiment.json').write_text(json.dumps(old))
    fake_run(tmp_path, exp, 'ape', 0)
    rc, err = cli(capsys, 'sweep', 'digits', '--conditions', 'ape', '--out', tmp_path, '--quiet')
    assert rc == 0, err
    assert json.loads((tmp_path / 'experiment.json').read_text())['rpi_mode'] == 'rpi'
    assert Experiment.load(tmp_path / 'experiment.json').rpi_mode == 'rpi'


def test_a_pickle_named_safetensors(tmp_path, capsys):
    f = tmp_path / 'model.safetensors'
    f.write_bytes(pickle.dumps({'weights': [1, 2, 3]}))
    rc, err = cli(capsys, 'analyze', f, '--out', tmp_path / 'a')
    assert rc == 2 and str(f) in err and 'not a safetensors file' in err, err


def test_a_duplicated_run_folder_is_named(tmp_path, capsys):
    write_results(result_frame([dict(metric='acc', value=.5)], condition='nope'), tmp_path / 'runs' / 'nope-s0' / 'results.csv')
    write_results(result_frame([dict(metric='acc', value=.5, sweep='alpha')], condition='ape'),
                  tmp_path / 'runs' / 'ape-s0' / 'results.csv')
    shutil.copytree(tmp_path / 'runs' / 'nope-s0', tmp_path / 'runs' / 'nope-s0 (copy)')
    with pytest.raises(ValueError, match=r'duplicate result rows.*runs/nope-s0 \(copy\)'): gather(tmp_path)
    rc, err = cli(capsys, 'report', tmp_path)
    assert rc == 2 and 'nope-s0 (copy)' in err, err


def test_two_datasets_in_one_table(tmp_path, capsys):
    from pe_anchors.testing import synthetic_results
    a = synthetic_results(seeds=(0,))
    b = a.assign(dataset='cifar10')
    write_results(pd.concat([a, b], ignore_index=True), tmp_path / 'two.csv')
    rc, err = cli(capsys, 'report', tmp_path / 'two.csv', '--dest', tmp_path / 'rep')
    assert rc == 2 and '2 datasets' in err and 'cifar10' in err, err


def test_a_full_disk_while_saving_the_model(tmp_path, capsys, monkeypatch):
    import safetensors.torch
    def full(*a, **k):
        raise safetensors.SafetensorError('Error while serializing: I/O error: No space left on device (os error 28)')
    monkeypatch.setattr(safetensors.torch, 'save_file', full)
    rc, err = cli(capsys, 'train', '--out', tmp_path / 'run', '--epochs', '1', '--bs', '256', '--quiet')
    assert rc == 2 and 'No space left on device' in err and 'model.safetensors' in err, err


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


# ---------------------------------------------------------------- issue 34: mistakes that lost data or ended in a traceback
def _hold(run: Path, shared: bool = False) -> subprocess.Popen:
    "Another process holding `run`'s RunLock (until killed); returns once it holds it."
    probe = (f"from pe_anchors.core import RunLock; import time\n"
             f"with RunLock({str(run)!r}, shared={shared}) as l: print(l.acquired, flush=True); time.sleep(120)")
    holder = subprocess.Popen([sys.executable, '-c', probe], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == 'True'
    return holder


def test_restart_of_a_run_another_process_trains_deletes_nothing(tmp_path, capsys):
    run = tmp_path / 'run'
    (run / 'checkpoints' / 'epoch_000').mkdir(parents=True)
    (run / 'checkpoints' / 'epoch_000' / 'model.safetensors').write_bytes(b'weights')
    for f in ('metrics.csv', 'final.json', 'model.safetensors'): (run / f).write_text('kept')
    holder = _hold(run)
    try: rc, err = cli(capsys, 'train', '--out', run, '--epochs', '1', '--bs', '256', '--restart', '--quiet')
    finally: holder.kill(); holder.wait()
    assert rc == 2 and 'is being trained by another process' in err, err
    assert all((run / f).read_text() == 'kept' for f in ('metrics.csv', 'final.json', 'model.safetensors'))
    assert (run / 'checkpoints' / 'epoch_000' / 'model.safetensors').exists()


# ---------------------------------------------------------------- the command line's one-line errors, one case per row
def _exp_file(tmp: Path, **fields) -> Path:
    "A small digits experiment file (YAML) with `fields` changed."
    import yaml
    d = {**tiny().to_dict(), **fields}
    p = tmp / 'e.yaml'; p.write_text(yaml.safe_dump(d, sort_keys=False))
    return p

def _sweep(**fields):
    "The argv of `sweep` on an experiment file with `fields`."
    return lambda t: ['sweep', _exp_file(t, **fields), '--out', t / 'o', '--quiet']


def _jpeg(size: int = 32, colour=(10, 120, 30)) -> bytes:
    import io
    from PIL import Image
    b = io.BytesIO(); Image.new('RGB', (size, size), colour).save(b, 'JPEG'); return b.getvalue()

def _npz(tmp: Path, train=None, drop=(), labels=None, damage=None) -> Path:
    "A packed CIFAR-10-like npz (2 classes, 4 + 4 JPEGs) with `train` images, keys `drop`ped, train `labels`, or `damage`d."
    import numpy as np
    d = {}
    for split, ims in (('train', train or [_jpeg()] * 4), ('val', [_jpeg()] * 4)):
        d[f'{split}_jpeg'] = np.frombuffer(b''.join(ims), np.uint8)
        d[f'{split}_offsets'] = np.cumsum([0] + [len(x) for x in ims]).astype(np.int64)
        d[f'{split}_labels'] = np.arange(len(ims)) % 2
    if labels is not None: d['train_labels'] = labels
    d['classes'] = np.array(['cat', 'dog'])
    for k in drop: d.pop(k)
    p = tmp / 'c.npz'; np.savez(p, **d)
    if damage == 'truncate': p.write_bytes(p.read_bytes()[:p.stat().st_size // 2])
    if damage == 'crc':
        b = bytearray(p.read_bytes()); i = b.find(_jpeg()[200:220]); b[i] ^= 0xFF; p.write_bytes(bytes(b))
    return p

def _train_on(**npz):
    "The argv of `train` on CIFAR-10 from a packed npz made by `_npz(**npz)`."
    return lambda t: ['train', '--data', 'cifar10', '--data-path', _npz(t, **npz), '--out', t / 'o', '--epochs', '1', '--quiet']

def _table(change):
    "The argv of `report` on a synthetic results CSV changed by `change` (a DataFrame -> DataFrame, or -> text)."
    def argv(t: Path):
        from pe_anchors.testing import synthetic_results
        p = t / 'r.csv'
        out = change(synthetic_results(seeds=(0,)))
        p.write_text(out if isinstance(out, str) else out.to_csv(index=False))
        return ['report', p, '--dest', t / 'rep']
    return argv

def _nano(tmp: Path, name: str = 'ape.safetensors', **meta) -> Path:
    "A digits-sized (16 px) pe_vit checkpoint, its metadata changed by `meta`."
    import timm
    from safetensors.torch import load_file, save_file
    from safetensors import safe_open
    from pe_anchors.vit import save_checkpoint
    p = save_checkpoint(timm.create_model('pe_vit_nano_patch2_16', pe='ape', num_classes=10), tmp / name)
    if meta:
        with safe_open(str(p), 'pt') as f: old = f.metadata()
        save_file(load_file(str(p)), str(p), metadata={**old, **meta})
    return p

def _analyze_trained_on_digits(t: Path):
    "`analyze` on CIFAR-10 (32 px, 10 classes) of a run trained on digits (16 px): its checkpoint and config.json."
    import numpy as np
    run = t / 'run'; run.mkdir()
    ck = _nano(run, 'model.safetensors')
    (run / 'config.json').write_text(json.dumps(dict(condition='ape', seed=0, data=dict(builder='digits', img_size=16))))
    npz = _npz(t, train=[_jpeg()] * 10, labels=np.arange(10))
    with np.load(npz) as d: z = dict(d)
    z['classes'] = np.array([f'c{i}' for i in range(10)]); np.savez(npz, **z)
    return ['analyze', run, '--data', 'cifar10', '--data-path', npz, '--out', t / 'a', '--quiet']

def _pickle_hub(t: Path):
    "`export` of a run whose kept Hub folder holds a pickle (running os.system) renamed model.safetensors."
    import timm
    from pe_anchors.vit import save_hub
    hub = save_hub(timm.create_model('pe_vit_nano_patch2_16', pe='ape', num_classes=10), t / 'run' / 'model')
    (hub / 'model.safetensors').write_bytes(pickle.dumps(_Planted()))
    return ['export', t / 'run', t / 'hub']

class _Planted:
    def __reduce__(self): return (os.system, ('echo planted',))

ROWS = [   # (case, argv from tmp_path, exit status, words the one stderr line holds)
    ('name-not-a-string', _sweep(name=123), 2, ['e.yaml', 'name must be a string', '123']),
    ('untrained-quoted', _sweep(untrained='false'), 2, ['e.yaml', 'untrained', "'false'", 'without quotes']),
    ('seed-a-bool', _sweep(seeds=[True]), 2, ['e.yaml', 'seeds[0]', 'True', 'whole number']),
    ('ssdc-images-a-string', _sweep(ssdc_images='32'), 2, ['e.yaml', 'ssdc_images', "'32'", 'without quotes']),
    ('n-perms-a-float', _sweep(n_perms=2.5), 2, ['e.yaml', 'n_perms', '2.5', 'whole number']),
    ('alphas-strings', _sweep(alphas=['1', '.5']), 2, ['e.yaml', 'alphas[0]', "'1'", 'number']),
    ('data-kwargs-unknown-key', _sweep(data_kwargs=dict(bakground=64)), 2, ['e.yaml', 'data_kwargs', "'bakground'", 'valid: seed']),
    ('data-kwargs-name', _sweep(data_kwargs=dict(name='mine')), 2, ['e.yaml', 'data_kwargs', "'name'", 'digits()']),
    ('data-kwargs-wrong-type', _sweep(data_kwargs=dict(img_size='16')), 2, ['e.yaml', 'data_kwargs.img_size', "'16'"]),
    ('train-kwargs-quoted-flag', _sweep(train_kwargs=dict(epochs=1, bf16='no')), 2, ['e.yaml', 'train_kwargs.bf16', "'no'"]),
    ('model-depth-a-string', _sweep(model_kwargs=dict(depth='2')), 2, ['e.yaml', 'model_kwargs.depth', "'2'"]),
    ('huge-depth', _sweep(model_kwargs=dict(depth=10**9)), 2, ['depth', 'GiB', 'this machine has', 'lower its depth']),
    ('huge-width', _sweep(model_kwargs=dict(depth=2, embed_dim=2**16, num_heads=4)), 2, ['embed_dim', 'GiB', 'this machine has']),
    ('huge-image-size', _sweep(data_kwargs=dict(img_size=100_000)), 2, ['img_size', 'GiB', 'this machine has']),
    ('npz-without-offsets', _train_on(drop=('train_offsets',)), 2, ['c.npz', 'lacks train_offsets']),
    ('npz-without-classes', _train_on(drop=('classes',)), 2, ['c.npz', 'lacks classes']),
    ('npz-empty-jpeg', _train_on(train=[_jpeg(), _jpeg(), b'', _jpeg()]), 2, ['c.npz', 'train image 2 is empty']),
    ('npz-broken-jpeg', _train_on(train=[_jpeg(), b'not a jpeg at all', _jpeg(), _jpeg()]), 2,
     ['c.npz', 'train image 1 is not a readable JPEG']),
    ('npz-truncated', _train_on(damage='truncate'), 2, ['c.npz', 'not a readable npz', 'truncated']),
    ('npz-bad-crc', _train_on(damage='crc'), 2, ['c.npz', 'train_jpeg does not read back', 'CRC']),
    ('npz-mixed-sizes', _train_on(train=[_jpeg(), _jpeg(), _jpeg(16), _jpeg()]), 2, ['c.npz', '2 sizes', 'image 2 (16, 16)']),
    ('npz-2d-labels', _train_on(labels=__import__('numpy').zeros((4, 2), int)), 2, ['c.npz', 'train_labels', '(4, 2)', '1-D']),
    ('npz-label-out-of-range', _train_on(labels=__import__('numpy').array([0, 1, 7, 0])), 2, ['c.npz', 'train labels (train_labels) hold 7, outside 0..1']),
    ('digits-valid-pct-0', _sweep(data_kwargs=dict(valid_pct=0)), 2, ['valid_pct', 'got 0']),
    ('digits-valid-pct-1.5', _sweep(data_kwargs=dict(valid_pct=1.5)), 2, ['valid_pct', 'got 1.5']),
    ('table-without-mode', _table(lambda d: d.drop(columns=['mode'])), 2, ['r.csv', 'lacks the column(s) mode']),
    ('table-without-stage', _table(lambda d: d.drop(columns=['stage'])), 2, ['r.csv', 'lacks the column(s) stage']),
    ('table-with-repeated-rows', _table(lambda d: pd.concat([d, d.iloc[3:5]])), 2, ['r.csv', 'repeats line 5', '2 repeated row(s)']),
    ('table-pasted-twice', _table(lambda d: d.to_csv(index=False) * 2), 2, ['r.csv', 'repeats the header']),
    ('analyze-on-other-data', _analyze_trained_on_digits, 2, ['16x16 px', 'trained on digits at 16 px', 'cifar10 has 32 px', '--data digits']),
    ('train-unknown-model', lambda t: ['train', '--model', 'pe_vit_nonexistent', '--out', t / 'o', '--quiet'], 2,
     ["unknown model 'pe_vit_nonexistent'", 'timm.list_models()']),
    ('sweep-unknown-model', _sweep(model='vit_nonexistent_patch4'), 2, ["unknown model 'vit_nonexistent_patch4'"]),
    ('checkpoint-of-unknown-model', lambda t: ['analyze', _nano(t, model_name='cape_vit_tiny'), '--out', t / 'a', '--quiet'], 2,
     ['ape.safetensors', "'cape_vit_tiny'", 'does not know']),
    ('pickle-in-a-hub-folder', _pickle_hub, 2, ['model/model.safetensors', 'not a safetensors file']),
    ('pretrained-timm-model', _sweep(model='vit_tiny_patch16_224', model_kwargs=dict(pretrained=True)), 2,
     ['e.yaml', 'model_kwargs.pretrained', 'vit_tiny_patch16_224', 'would be downloaded', '--allow-network']),
    ('hf-hub-model-in-a-file', _sweep(model='hf-hub:timm/vit_tiny_patch16_224.augreg_in21k'), 2,
     ['e.yaml', 'hf-hub:timm/vit_tiny_patch16_224.augreg_in21k', 'Hugging Face Hub', '--allow-network']),
    ('hf-hub-model-in-a-checkpoint', lambda t: ['analyze', _nano(t, model_name='hf-hub:timm/vit_tiny_patch16_224'),
                                                '--out', t / 'a', '--quiet'], 2,
     ['ape.safetensors', 'hf-hub:timm/vit_tiny_patch16_224', '--allow-network']),
    ('train-an-hf-hub-model', lambda t: ['train', '--model', 'hf-hub:timm/vit_tiny_patch16_224', '--condition', 'nope',
                                         '--out', t / 'o', '--quiet'], 2, ['hf-hub:timm/vit_tiny_patch16_224', '--allow-network']),
    ('download-in-a-file', _sweep(data='cifar10', data_kwargs=dict(download=True)), 2,
     ['e.yaml', 'data_kwargs.download', 'cifar10 dataset', '--allow-network']),
]

@pytest.fixture
def lookups(monkeypatch) -> list:
    "Every DNS lookup or connection attempted (each refused): none is expected."
    import socket
    seen = []
    def refuse(*a, **k): seen.append(a[:2]); raise OSError('no network in this test')
    for name in ('getaddrinfo', 'create_connection'): monkeypatch.setattr(socket, name, refuse)
    return seen

@pytest.mark.parametrize('argv, status, words', [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_one_line_errors(tmp_path, capsys, lookups, argv, status, words):
    rc, err = cli(capsys, *argv(tmp_path))                     # `cli` fails on a second line or a Traceback
    assert rc == status and all(w in err for w in words), err
    assert not lookups, lookups                                         # offline: not even a DNS lookup
    assert not (tmp_path / 'o' / 'experiment.json').exists()                # refused before anything is written


@pytest.mark.parametrize('fields, kind', [(dict(name=123), TypeError), (dict(untrained='false'), TypeError),
                                          (dict(seeds=[True]), TypeError), (dict(n_perms=2.0), TypeError),
                                          (dict(alphas=['1']), TypeError), (dict(n_perms=0), ValueError),
                                          (dict(seeds=[-1]), ValueError), (dict(data_kwargs=dict(name='x')), ValueError)])
def test_the_library_raises_typed_errors_with_the_same_message(fields, kind):
    from pe_anchors.experiment import ExperimentError
    with pytest.raises(ExperimentError) as e: tiny(**fields)
    assert isinstance(e.value, kind) and isinstance(e.value, ValueError) and str(next(iter(fields))) in str(e.value)


def test_a_data_kwargs_name_reaches_a_builder_that_takes_one(tmp_path):
    from PIL import Image
    from pe_anchors.data import get_data
    for split in ('train', 'val'):
        for c in ('a', 'b'):
            (tmp_path / split / c).mkdir(parents=True)
            Image.new('RGB', (8, 8), (10, 200, 30)).save(tmp_path / split / c / 'x.png')
    assert get_data(str(tmp_path), name='mine', img_size=8).name == 'mine'   # not "multiple values for argument 'name'"
    assert Experiment(data=str(tmp_path), data_kwargs=dict(name='mine', img_size=8)).data_kwargs['name'] == 'mine'


def test_a_sweep_prints_its_cost_before_it_starts(tmp_path, capsys):
    from pe_anchors.data import digits
    from pe_anchors.experiment import experiment_cost
    exp = tiny(n_perms=3)
    d = digits(background=64)
    c = experiment_cost(exp, d)
    assert c['trained'] == 2 * 1 * len(d.train) and c['measured'] > 2 * 32 * (1 + 3)
    assert experiment_cost(tiny(n_perms=30), d)['measured'] > c['measured']
    for cond, s in exp.runs(): fake_run(tmp_path, exp, cond, s)        # finished: the sweep only gathers them
    f = _exp_file(tmp_path, n_perms=3)
    rc = main(['sweep', str(f), '--out', str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0 and f"2 run(s) × 1 epoch(s) × {len(d.train):,} images = {2 * len(d.train):,} training images" in out, out
    assert f"measuring: {c['measured']:,} images" in out and '3 permutation draw(s)' in out, out


def test_an_animated_gif_in_an_image_folder_is_skipped_and_named(tmp_path, caplog):
    from PIL import Image
    from pe_anchors.data import decode_file, image_folder
    for split in ('train', 'val'):
        for c in ('a', 'b'):
            (tmp_path / split / c).mkdir(parents=True)
            for i in range(2): Image.new('RGB', (8, 8), (60 * i, 0, 0)).save(tmp_path / split / c / f'{i}.png')
    frames = [Image.new('RGB', (8, 8), (0, 0, 40 * k)) for k in range(3)]
    gif = tmp_path / 'train' / 'a' / 'anim.gif'
    frames[0].save(gif, save_all=True, append_images=frames[1:], duration=100, loop=0)
    with pytest.raises(ValueError, match=r'anim.gif is animated \(3 frames\)'): decode_file(gif, 8)
    for in_memory in (True, False):
        with caplog.at_level('WARNING', logger='pe_anchors.data'):
            d = image_folder(tmp_path, img_size=8, in_memory=in_memory)
        assert len(d.train) == 4 and 'anim.gif' in caplog.text, caplog.text     # the four still images, the GIF named
        assert not in_memory or 'is animated (3 frames)' in caplog.text, caplog.text     # decoded: and why
        caplog.clear()


@pytest.fixture
def finished_run(tmp_path):
    "A run directory as `pe_anchors train` leaves it (a checkpoint and config), without training."
    run = tmp_path / 'run'; run.mkdir()
    _nano(run, 'model.safetensors')
    (run / 'config.json').write_text(json.dumps(dict(condition='ape', seed=0, data=dict(builder='digits', img_size=16))))
    return run


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
    from pe_anchors import vit
    from pe_anchors.experiment import export_run
    real = vit._model_card
    def torn(*a, **k): raise OSError(errno.ENOSPC, 'No space left on device')   # after the weights, before the card
    monkeypatch.setattr(vit, '_model_card', torn)
    with pytest.raises(OSError, match='No space left'): export_run(finished_run, tmp_path / 'hub')
    assert not (tmp_path / 'hub').exists() and not list(tmp_path.glob('.hub.*'))
    monkeypatch.setattr(vit, '_model_card', real)
    out = export_run(finished_run, tmp_path / 'hub')
    assert sorted(p.name for p in out.iterdir()) == ['README.md', 'config.json', 'model.safetensors']


def _free_port() -> int:
    import socket
    with socket.socket() as s: s.bind(('127.0.0.1', 0)); return s.getsockname()[1]

@pytest.mark.parametrize('env, words', [
    (dict(MASTER_ADDR='127.0.0.1', PE_ANCHORS_DIST_TIMEOUT='3'), ['did not join within 3 s', 'torchrun', 'PE_ANCHORS_DIST_TIMEOUT']),
    (dict(), ['MASTER_ADDR', 'torchrun', 'unset WORLD_SIZE'])], ids=['waits-for-rank-1', 'no-launcher'])
def test_a_second_rank_that_never_comes_times_out(tmp_path, env, words):
    e = {**os.environ, 'WORLD_SIZE': '2', 'RANK': '0', 'LOCAL_RANK': '0', 'PE_ANCHORS_QUIET': '1', **env}
    if 'MASTER_ADDR' in env: e['MASTER_PORT'] = str(_free_port())
    else: e.pop('MASTER_ADDR', None); e.pop('MASTER_PORT', None)
    r = subprocess.run([sys.executable, '-m', 'pe_anchors.cli', 'train', '--out', str(tmp_path / 'run'), '--epochs', '1',
                        '--device', 'cpu', '--quiet'], capture_output=True, text=True, env=e, timeout=90)
    lines = [l for l in r.stderr.splitlines() if l.strip() and 'Warning' not in l and 'warnings.warn' not in l]
    assert r.returncode == 2 and len(lines) == 1 and 'Traceback' not in r.stderr, r.stderr
    assert all(w in lines[0] for w in words), lines


def _measured_with(d: Path, exp, cond: str, seed: int, n_images: int, n_perms: int):
    "Rewrite run (cond, seed)'s results as if measured over `n_images` SSDC images and `n_perms` RPI draws."
    rows = [dict(metric='acc', shift='clean', value=.5, n_images=360),
            dict(metric='ssdc', mode='normal', layer=0, value=.3, n_perms=0, n_images=n_images),
            dict(metric='ssdc', mode='rpi', layer=0, value=.1, n_perms=n_perms, n_images=n_images)]
    write_results(result_frame(rows, experiment=exp.name, dataset='digits', condition=cond, seed=seed),
                  d / 'runs' / f'{cond}-s{seed}' / 'results.csv')

def test_a_run_measured_with_other_settings_is_refused(tmp_path, capsys):
    from pe_anchors.experiment import padding_ablation, signal_ratios
    from pe_anchors.results import check_runs
    exp = tiny()                                                       # 32 SSDC images, 1 permutation draw
    (tmp_path / 'experiment.json').write_text(json.dumps(exp.to_dict()))
    for c, s in exp.runs(): fake_run(tmp_path, exp, c, s)
    for c, s in exp.runs(): _measured_with(tmp_path, exp, c, s, 32, 1)
    gather(tmp_path)                                                   # the experiment's own settings: read
    _measured_with(tmp_path, exp, 'nope', 0, 64, 2)                    # copied in: same training, other measurement
    for call in (lambda: gather(tmp_path), lambda: check_runs(tmp_path), lambda: signal_ratios(tmp_path),
                 lambda: padding_ablation(tmp_path)):
        with pytest.raises(ValueError, match=r'runs/nope-s0 was measured with other settings.*n_perms 2.*n_perms: 1'): call()
    (tmp_path / 'cfg').mkdir()
    for argv in (('report', tmp_path), ('sweep', _exp_file(tmp_path / 'cfg'), '--out', tmp_path, '--quiet')):
        rc, err = cli(capsys, *argv)
        assert rc == 2 and 'runs/nope-s0 was measured with other settings' in err and 'n_images 64' in err, err


def test_the_network_is_used_only_when_asked(tmp_path, capsys, monkeypatch, lookups):
    from pe_anchors.core import NETWORK_ENV, NetworkRefused
    monkeypatch.delenv(NETWORK_ENV, raising=False)
    with pytest.raises(NetworkRefused, match='vit_tiny_patch16_224'): tiny(model='vit_tiny_patch16_224', model_kwargs=dict(pretrained=True))
    monkeypatch.setenv(NETWORK_ENV, '1')                               # the user's opt-in
    assert tiny(model='hf-hub:timm/vit_tiny_patch16_224').model.startswith('hf-hub:')
    monkeypatch.delenv(NETWORK_ENV)
    rc, err = cli(capsys, '--allow-network', 'train', '--model', 'hf-hub:timm/x', '--condition', 'nope', '--out', tmp_path / 'o',
                  '--quiet')                                            # allowed: it tries (and fails here: no network)
    assert lookups and NETWORK_ENV not in os.environ                   # asked for this command only
    assert 'would be downloaded' not in err
