"""Mistakes end in one line: every user mistake (a field, a file, a dataset, a model, an option) gives one line naming
what is wrong and what to do, exit status 2 from the command line, nothing written; inputs that would give a silent
wrong answer are refused."""
import json, os, pickle, re, subprocess
from pathlib import Path

import pandas as pd
import pytest
import torch

import pe_anchors  # noqa: F401
from pe_anchors.config import Experiment
from pe_anchors.results import result_frame
from pe_anchors.learner import pe_learner

from conftest import ROOT, cli, fake_run, exp_file, nano_checkpoint, tiny


def _sweep(**fields):
    "The argv of `sweep` on an experiment file with `fields`."
    return lambda t: ['sweep', exp_file(t, **fields), '--out', t / 'o', '--quiet']


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


def _analyze_trained_on_digits(t: Path):
    "`analyze` on CIFAR-10 (32 px, 10 classes) of a run trained on digits (16 px): its checkpoint and config.json."
    import numpy as np
    run = t / 'run'; run.mkdir()
    ck = nano_checkpoint(run, 'model.safetensors')
    (run / 'config.json').write_text(json.dumps(dict(condition='ape', seed=0, data=dict(builder='digits', img_size=16))))
    npz = _npz(t, train=[_jpeg()] * 10, labels=np.arange(10))
    with np.load(npz) as d: z = dict(d)
    z['classes'] = np.array([f'c{i}' for i in range(10)]); np.savez(npz, **z)
    return ['analyze', run, '--data', 'cifar10', '--data-path', npz, '--out', t / 'a', '--quiet']


def _pickle_hub(t: Path):
    "`export` of a run whose kept Hub folder holds a pickle (running os.system) renamed model.safetensors."
    import timm
    from pe_anchors.hub import save_hub
    hub = save_hub(timm.create_model('pe_vit_nano_patch2_16', pe='ape', num_classes=10), t / 'run' / 'model')
    (hub / 'model.safetensors').write_bytes(pickle.dumps(_Planted()))
    return ['export', t / 'run', t / 'hub']


def _deep_yaml(t: Path):
    "`sweep` of an experiment file nested 5000 levels deep (a YAML bomb of brackets)."
    (t / 'e.yaml').write_text('name: ' + '[' * 5000 + ']' * 5000 + '\n')
    return ['sweep', t / 'e.yaml', '--out', t / 'o', '--quiet']


def _report_csv(t: Path) -> Path:
    from pe_anchors.testing import synthetic_results
    p = t / 'r.csv'; synthetic_results(seeds=(0,)).to_csv(p, index=False)
    return p


def _hub_run(t: Path) -> Path:
    "A run whose kept model is a Hub folder (what `export` reads)."
    import timm
    from pe_anchors.hub import save_hub
    save_hub(timm.create_model('pe_vit_nano_patch2_16', pe='ape', num_classes=10), t / 'run' / 'model')
    return t / 'run'


def _folder(t: Path) -> Path:
    "An image folder of 2 classes (train/, val/), 16 px JPEGs."
    for split in ('train', 'val'):
        for c in ('a', 'b'):
            (t / 'imgs' / split / c).mkdir(parents=True, exist_ok=True)
            for i in range(4): (t / 'imgs' / split / c / f'{i}.jpg').write_bytes(_jpeg(16))
    return t / 'imgs'


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
    ('checkpoint-of-unknown-model', lambda t: ['analyze', nano_checkpoint(t, model_name='cape_vit_tiny'), '--out', t / 'a', '--quiet'], 2,
     ['ape.safetensors', "'cape_vit_tiny'", 'does not know']),
    ('pickle-in-a-hub-folder', _pickle_hub, 2, ['model/model.safetensors', 'not a safetensors file']),
    ('pretrained-timm-model', _sweep(model='vit_tiny_patch16_224', model_kwargs=dict(pretrained=True)), 2,
     ['e.yaml', 'model_kwargs.pretrained', 'vit_tiny_patch16_224', 'would be downloaded', '--allow-network']),
    ('hf-hub-model-in-a-file', _sweep(model='hf-hub:timm/vit_tiny_patch16_224.augreg_in21k'), 2,
     ['e.yaml', 'hf-hub:timm/vit_tiny_patch16_224.augreg_in21k', 'Hugging Face Hub', '--allow-network']),
    ('hf-hub-model-in-a-checkpoint', lambda t: ['analyze', nano_checkpoint(t, model_name='hf-hub:timm/vit_tiny_patch16_224'),
                                                '--out', t / 'a', '--quiet'], 2,
     ['ape.safetensors', 'hf-hub:timm/vit_tiny_patch16_224', '--allow-network']),
    ('train-an-hf-hub-model', lambda t: ['train', '--model', 'hf-hub:timm/vit_tiny_patch16_224', '--condition', 'nope',
                                         '--out', t / 'o', '--quiet'], 2, ['hf-hub:timm/vit_tiny_patch16_224', '--allow-network']),
    ('download-in-a-file', _sweep(data='cifar10', data_kwargs=dict(download=True)), 2,
     ['e.yaml', 'data_kwargs.download', 'cifar10 dataset', '--allow-network']),
    # issue 51: the cases that ended in a traceback, and values that were checked only after experiment.json was written
    ('train-out-name-too-long', lambda t: ['train', '--out', t / ('x' * 300), '--quiet'], 2, ['--out', 'more than this file system allows']),
    ('sweep-out-name-too-long', lambda t: ['sweep', exp_file(t), '--out', t / ('x' * 300), '--quiet'], 2, ['--out', '300 bytes long']),
    ('analyze-out-name-too-long', lambda t: ['analyze', nano_checkpoint(t), '--out', t / ('x' * 300), '--quiet'], 2, ['--out', '300 bytes']),
    ('report-dest-name-too-long', lambda t: ['report', _report_csv(t), '--dest', t / ('x' * 300)], 2, ['--dest', '300 bytes']),
    ('export-name-too-long', lambda t: ['export', _hub_run(t), t / ('x' * 300)], 2, ['the folder', '300 bytes']),
    ('study-out-name-too-long', lambda t: ['study', ROOT / 'nbs' / 'results' / 'digits', '--signal', '--out', t / ('x' * 300)], 2,
     ['--out', '300 bytes']),
    ('yaml-nested-too-deeply', _deep_yaml, 2, ['e.yaml', 'nested too deeply']),
    ('mixup-unknown-key', _sweep(train_kwargs=dict(epochs=1, mixup=dict(alpha=.8))), 2, ["unknown argument(s) ['alpha']", 'Mixup']),
    ('optimizer-unknown', _sweep(train_kwargs=dict(epochs=1, opt='sgd')), 2, ["unknown optimizer 'sgd'", "'adamw'"]),
    ('augmentation-unknown', _sweep(train_kwargs=dict(epochs=1, aug='bogus')), 2, ["unknown augmentation 'bogus'", "'crop_flip'"]),
    ('batch-larger-than-the-data', _sweep(train_kwargs=dict(epochs=1, bs=100_000)), 2, ['batch size 100000', '1437 training images']),
    ('negative-width', _sweep(model_kwargs=dict(depth=2, mlp_ratio=-1.)), 2, ['model_kwargs', 'negative dimension']),
    ('negative-embed-dim', _sweep(model_kwargs=dict(depth=2, embed_dim=-64)), 2, ['e.yaml', 'model_kwargs.embed_dim', '>= 1', '-64']),
    ('alpha-1e308', _sweep(alphas=[1., 1e308]), 2, ['e.yaml', 'alphas[1]', '0..1000']),
    ('shift-ref-size-too-small', _sweep(shift_ref_size=1), 2, ['shift_ref_size 1', 'does not fit 16 px images']),
    ('image-folder-unknown-key', lambda t: _sweep(data=str(_folder(t)), data_kwargs=dict(bakground=64))(t), 2,
     ['data_kwargs', "'bakground'", 'image_folder()']),
    ('study-sizes-beyond-memory', lambda t: ['study', ROOT / 'nbs' / 'results' / 'digits', '--resolution', '--sizes', '100000',
                                             '--out', t / 'o'], 2, ['--sizes 100000', 'GiB of memory', 'this machine has']),
    ('atlas-unknown-timm-model', lambda t: ['atlas', 'vit_nonexistent_patch4', '--data-path', t / 'c.npz', '--out', t / 'o'], 2,
     ["atlas: unknown model 'vit_nonexistent_patch4'", 'timm.list_models()']),
    ('atlas-pretrained-offline', lambda t: ['atlas', 'vit_tiny_patch16_224.augreg_in21k', '--data-path', t / 'c.npz', '--out', t / 'o'], 2,
     ['atlas', 'pretrained weights of vit_tiny_patch16_224.augreg_in21k', '--allow-network']),
    ('threads-beyond-the-cores', lambda t: ['train', '--out', t / 'o', '--threads', '100000'], 2, ['--threads', 'more than the', 'core(s)']),
    ('sweep-threads-beyond-the-cores', lambda t: ['sweep', exp_file(t), '--out', t / 'o', '--threads', '99999999'], 2,
     ['--threads', '99999999', 'more than the', 'core(s)']),
    ('cpu-isa-unknown', lambda t: ['--cpu-isa', 'avx9', 'train', '--out', t / 'o'], 2, ["unknown CPU instruction set 'avx9'", "'avx2'"]),
]


@pytest.fixture(scope='module')
def ckpt(tmp_path_factory):
    import timm
    from pe_anchors.hub import save_checkpoint
    p = tmp_path_factory.mktemp('ck') / 'ape.safetensors'
    return save_checkpoint(timm.create_model('pe_vit_nano_patch2_16', pe='ape', num_classes=10), p)


@pytest.mark.parametrize('argv, status, words', [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_one_line_errors(tmp_path, capsys, lookups, argv, status, words):
    rc, err = cli(capsys, *argv(tmp_path))                     # `cli` fails on a second line or a Traceback
    assert rc == status and all(w in err for w in words), err
    assert not lookups, lookups                                         # offline: not even a DNS lookup
    assert not (tmp_path / 'o' / 'experiment.json').exists()                # refused before anything is written


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
    assert rc == 2 and 'α must be a number in 0..1000, got 1e300' in err, err            # refused before anything runs
    rc, err = cli(capsys, 'analyze', ckpt, '--alphas', 'inf', '--out', tmp_path)
    assert rc == 2 and 'α' in err, err


def test_inputs_that_would_give_silent_wrong_answers_are_refused(small):
    from pe_anchors.vit import PEViT
    from pe_anchors.robustness import evaluate_accuracy
    from pe_anchors.interventions import measure_ssdc
    with pytest.raises(ValueError, match='larger than the 256 training images'): pe_learner(small, 'ape', bs=512, show_progress=False)
    with pytest.raises(ValueError, match='not a multiple of patch_size'): PEViT(img_size=18, patch_size=4)
    m = PEViT(img_size=16, patch_size=2, embed_dim=32, depth=2, num_heads=2, num_classes=10).eval()
    x = small.valid.images[:8]
    with pytest.raises(ValueError, match='labels outside 0..9'): evaluate_accuracy(m, [(x, torch.full((8,), 12))], small.normalize)
    with torch.no_grad(): m.head.weight.fill_(float('nan'))
    with pytest.raises(ValueError, match='not finite'): evaluate_accuracy(m, [(x, torch.zeros(8, dtype=torch.long))], small.normalize)
    with pytest.raises(ValueError, match='does not match the model'): measure_ssdc(m, [small.normalize(x)], grid_size=4)


def test_environment_errors_are_one_line(tmp_path, small):
    env = {**os.environ, 'PE_ANCHORS_QUIET': '1'}
    run = lambda *a: subprocess.run(['pe_anchors', *a], capture_output=True, text=True, env=env, timeout=300)
    (tmp_path / 'bad.yaml').write_text('name: [unclosed')
    r = run('sweep', str(tmp_path / 'bad.yaml'), '--out', str(tmp_path / 'o'))
    assert r.returncode == 2 and 'Traceback' not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    import timm
    from pe_anchors.hub import save_checkpoint
    m = timm.create_model('pe_vit_nano_patch2_16', pe='ape')
    save_checkpoint(m, tmp_path / 'm.safetensors')
    from safetensors.torch import load_file, save_file
    from safetensors import safe_open
    with safe_open(str(tmp_path / 'm.safetensors'), 'pt') as f: meta = f.metadata()
    sd = load_file(str(tmp_path / 'm.safetensors')); sd.pop('head.weight')
    save_file(sd, str(tmp_path / 'm.safetensors'), metadata=meta)               # a mismatched checkpoint
    r = run('analyze', str(tmp_path / 'm.safetensors'), '--condition', 'ape', '--out', str(tmp_path / 'a'))
    assert r.returncode == 2 and 'does not match its own model config' in r.stderr and 'Traceback' not in r.stderr
