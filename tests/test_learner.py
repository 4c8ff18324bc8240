"""pe_anchors.learner: recipes, optimiser groups, run directories, exact resume, determinism, DDP, benchmark."""
import json, os, socket, subprocess, sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from fastai.callback.core import Callback
from fastai.optimizer import OptimWrapper

from pe_anchors.callback.permute import RPT
from pe_anchors.data import digits
from pe_anchors.learner import (RECIPES, get_recipe, SoftTargetCE, param_groups, pe_learner, fit_recipe, train,
                                pe_splitter)
from pe_anchors.pos_embed import PE_NAMES
from pe_anchors.hub import load_checkpoint

from conftest import FAST, weights

ROOT = Path(__file__).resolve().parents[1]


def test_paper_recipe_is_the_papers():
    p = RECIPES['paper']
    assert (p.epochs, p.bs, p.lr, p.wd, tuple(p.betas), p.label_smoothing) == (60, 128, 1e-3, 5e-2, (0.9, 0.999), 0.1)
    assert p.moms == (0.9, 0.9, 0.9) and not p.bf16
    f = RECIPES['fast']
    assert f.bf16 and f.channels_last and f.moms is None and (f.lr, f.wd) == (p.lr, p.wd)
    with pytest.raises(ValueError, match='unknown recipe field'): get_recipe('fast', lrr=1)


def test_soft_target_ce_matches_formula():
    torch.manual_seed(0)
    pred, y = torch.randn(6, 4), torch.tensor([0, 1, 2, 3, 0, 1])
    ls = 0.1
    soft = F.one_hot(y, 4).float() * (1 - ls) + ls / 4
    want = -(soft * pred.log_softmax(-1)).sum(-1).mean()
    torch.testing.assert_close(SoftTargetCE(ls)(pred, y), want)
    torch.testing.assert_close(SoftTargetCE()(pred, soft), want)


@pytest.mark.parametrize('pe', PE_NAMES)
def test_weight_decay_groups_honour_no_weight_decay(pe, small):
    learn = pe_learner(small, 'ape', pe=pe, recipe='paper', **FAST)
    learn.create_opt()
    assert isinstance(learn.opt, OptimWrapper) and isinstance(learn.opt.opt, torch.optim.AdamW)
    names = {id(p): n for n, p in learn.model.named_parameters()}
    groups = learn.opt.opt.param_groups
    learn.opt.set_hypers(wd=learn.wd)
    kinds = list(param_groups(learn.model))
    assert [g['weight_decay'] for g in groups] == [0.05 if k in ('body', 'head') else 0. for k in kinds]
    nodecay = {names[id(p)] for g in groups if g['weight_decay'] == 0 for p in g['params']}
    for n in learn.model.no_weight_decay(): assert n in nodecay
    for g in groups:
        if g['weight_decay']: assert all(p.ndim >= 2 and names[id(p)] not in learn.model.no_weight_decay() for p in g['params'])
    assert sum(len(g['params']) for g in groups) == len(list(learn.model.parameters()))


def test_freeze_trains_the_head_only(small):
    # fastai's freeze(): the last layer group (the head) trains; norms stay trainable (fastai's train_bn default)
    learn = pe_learner(small, 'ape', **FAST)
    learn.freeze()
    trainable = {n for n, p in learn.model.named_parameters() if p.requires_grad}
    norms = {n for n, p in learn.model.named_parameters() if 'norm' in n}
    assert trainable == {'head.weight', 'head.bias'} | norms
    assert not learn.model.pos_embed.pos_embed.requires_grad and not learn.model.cls_token.requires_grad
    learn.unfreeze()
    assert all(p.requires_grad for p in learn.model.parameters())


def test_position_lr_multiplier(small):
    learn = pe_learner(small, 'ape', pe_lr_mult=10, **FAST)
    fit_recipe(learn, epochs=1)
    lrs = {k: h['lr'] for k, h in zip(param_groups(learn.model), learn.opt.hypers)}
    assert lrs['position'] == pytest.approx(10 * lrs['body']) and lrs['head'] == pytest.approx(lrs['body'])


def test_export_load_learner_predict_round_trip(small, tmp_path):
    from fastai.learner import load_learner
    learn = pe_learner(small, 'ape', **FAST)
    fit_recipe(learn, epochs=1)
    learn.path = tmp_path
    learn.export('model.pkl')
    back = load_learner(tmp_path / 'model.pkl')
    img = small.valid.images[3]
    label, idx, probs = back.predict(img)
    ref = learn.model.eval()(small.normalize(img[None].float()))[0].softmax(-1)
    assert label == small.classes[int(idx)] and torch.allclose(probs, ref, atol=1e-5)
    assert back.dls.vocab == learn.dls.vocab and len(back.dls.train.dataset) == 0   # no data in the file
    from fastai.interpret import ClassificationInterpretation
    interp = ClassificationInterpretation.from_learner(learn)
    assert interp.confusion_matrix().sum() == len(small.valid)
    import matplotlib; matplotlib.use('Agg')
    learn.dls.show_batch(max_n=4); learn.show_results(max_n=4)


def test_rpt_finds_the_vit_inside_vision_learner():
    from fastai.vision.learner import vision_learner
    from pe_anchors.anatomy import anatomy
    d = digits()
    from fastai.losses import CrossEntropyLossFlat
    learn = vision_learner(d.dls(bs=32, device='cpu'), 'vit_tiny_patch16_224', pretrained=False, img_size=16,
                           patch_size=4, n_out=10, loss_func=CrossEntropyLossFlat(), cbs=[RPT(seed=0)])
    vit = anatomy(learn.model).model
    assert anatomy(learn.model).family == 'vit' and vit is not learn.model
    with learn.no_bar(), learn.no_logging(): learn.fit(1, 1e-3)
    assert learn.rpt.last_perm is not None and learn.rpt.last_perm.shape[-1] == 16


def test_batch_jobs_log_one_line_per_epoch(small, capsys, monkeypatch):
    monkeypatch.delenv('PE_ANCHORS_QUIET', raising=False)
    learn = pe_learner(small, 'ape', epochs=2, bs=64, model_kwargs=dict(depth=1), device='cpu')   # show_progress=None
    fit_recipe(learn)
    lines = [l for l in capsys.readouterr().out.splitlines() if l.startswith('epoch ')]
    assert len(lines) == 2 and 'accuracy' in lines[0] and 'valid_loss' in lines[1]


def test_pretrained_cfg_carries_the_training_statistics(small, tmp_path):
    from timm.data import resolve_model_data_config
    learn = pe_learner(small, 'ape', run_dir=tmp_path / 'run', **FAST)
    fit_recipe(learn, epochs=1)
    cfg = resolve_model_data_config(learn.model)
    assert cfg['mean'] == tuple(small.mean) and cfg['std'] == tuple(small.std) and cfg['input_size'] == (3, 16, 16)
    back = load_checkpoint(tmp_path / 'run' / 'model.safetensors')
    assert resolve_model_data_config(back)['mean'] == tuple(small.mean)


def test_a_trained_cnn_is_saved_and_rebuilt(small, tmp_path):
    "A timm CNN trained as a baseline is written with its own name and kwargs and rebuilt by `load_run_model`."
    from pe_anchors.experiment import load_run_model, run_dir_of
    out = train('nope', small, 'fast', run_dir=run_dir_of(tmp_path, 'nope', 0) / 'train', model='resnet10t',
                model_kwargs=dict(drop_rate=.1), epochs=1, bs=64, show_progress=False)
    x = small.normalize(next(iter(small.valid_uint8(bs=8, device='cpu')))[0])
    net = out['learn'].model.eval()
    for back in (load_checkpoint(run_dir_of(tmp_path, 'nope', 0) / 'train' / 'model.safetensors'), load_run_model(tmp_path, 'nope')):
        back = back.eval()
        assert type(back) is type(net) and back.drop_rate == .1 and back.num_classes == small.c
        with torch.no_grad(): assert torch.equal(back(x), net(x))


def test_conditions_set_pe_and_rpt(small):
    assert pe_learner(small, 'nope', **FAST).model.pe == 'none'
    l = pe_learner(small, 'rpt', **FAST)
    assert l.model.pe == 'ape' and any(isinstance(cb, RPT) for cb in l.cbs)
    assert not any(isinstance(cb, RPT) for cb in pe_learner(small, 'rope', **FAST).cbs)
    assert any(isinstance(cb, RPT) for cb in pe_learner(small, 'rope', rpt=True, **FAST).cbs)
    with pytest.raises(ValueError, match='expects 32px'): pe_learner(small, model='pe_vit_tiny_patch4_32', **FAST)


def _weights(res): return weights(res['learn'].model)


def test_same_seed_same_weights(small):
    a = _weights(train('rpt', small, epochs=1, seed=3, **FAST))
    b = _weights(train('rpt', small, epochs=1, seed=3, **FAST))
    c = _weights(train('rpt', small, epochs=1, seed=4, **FAST))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_run_directory_layout(tmp_path, small):
    res = train('ape', small, run_dir=tmp_path, epochs=2, **FAST)
    files = {str(p.relative_to(tmp_path)) for p in tmp_path.rglob('*') if p.is_file()}
    assert files == {'config.json', 'metrics.csv', 'model.safetensors', 'final.json', '.lock',   # two checkpoints kept
                     'checkpoints/epoch_000/model.safetensors', 'checkpoints/epoch_000/state.pt',
                     'checkpoints/epoch_001/model.safetensors', 'checkpoints/epoch_001/state.pt'}
    cfg = json.loads((tmp_path / 'config.json').read_text())
    assert cfg['condition'] == 'ape' and cfg['pe'] == 'ape' and cfg['rpt'] is False and cfg['seed'] == 0
    assert cfg['model'] == 'pe_vit_nano_patch2_16' and cfg['model_kwargs'] == {'depth': 1}
    assert cfg['recipe']['epochs'] == 2 and cfg['data']['builder'] == 'digits' and 'hardware' in cfg
    final = json.loads((tmp_path / 'final.json').read_text())
    assert set(final) >= {'epochs', 'accuracy', 'valid_loss', 'train_time_s', 'train_img_s', 'hardware'}
    m = load_checkpoint(tmp_path / 'model.safetensors')
    assert all(torch.equal(v, res['learn'].model.state_dict()[k]) for k, v in m.state_dict().items())
    assert abs(final['accuracy'] - float(res['learn'].validate()[1])) < 1e-6
    header = (tmp_path / 'metrics.csv').read_text().splitlines()[0].split(',')
    assert header == ['epoch', 'train_loss', 'valid_loss', 'accuracy', 'lr', 'time_s', 'train_img_s']


def _free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0)); return s.getsockname()[1]


def test_ddp_two_process_gloo(tmp_path):
    env = {**os.environ, 'PYTHONPATH': str(ROOT) + os.pathsep + os.environ.get('PYTHONPATH', ''),
           'PE_ANCHORS_QUIET': '1'}
    cmd = [sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node=2', f'--master_port={_free_port()}',
           str(ROOT / 'tests' / 'ddp_worker.py'), str(tmp_path)]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    r0, r1 = (torch.load(tmp_path / f'rank{r}.pt') for r in (0, 1))
    assert r0['world'] == r1['world'] == 2
    assert r0['n_iter'] == r1['n_iter'] == (1437 // 2) // 32                    # each rank: half the data
    assert not set(r0['idxs']) & set(r1['idxs'])                                # disjoint shards
    assert all(torch.equal(r0['sd'][k], r1['sd'][k]) for k in r0['sd'])        # gradients were averaged
    init = pe_learner('digits', 'rpt', model_kwargs=dict(depth=1), show_progress=False).model.state_dict()
    assert not torch.equal(init['head.weight'], r0['sd']['head.weight'])        # and training happened
    assert r0['acc'] == r1['acc'] and (tmp_path / 'run' / 'final.json').exists()


@pytest.mark.cuda
def test_fast_recipe_on_gpu(small):
    learn = pe_learner(small, 'rope', recipe='fast', device='cuda', **FAST)
    fit_recipe(learn, epochs=1)
    assert next(learn.model.parameters()).is_cuda and learn.opt.opt.defaults['fused']


def test_progress_bars_on_request(small):
    from fastai.callback.progress import ProgressCallback
    from pe_anchors.learner import Progress
    quiet = pe_learner(small, **FAST)
    assert not any(isinstance(cb, ProgressCallback) for cb in quiet.cbs) and quiet.logger is not print
    shown = pe_learner(small, **{**FAST, 'show_progress': True})
    assert any(isinstance(cb, Progress) for cb in shown.cbs)


# pe_learner's parts, each on its own

def test_build_model_takes_pe_for_pe_vit_models_only(small):
    import timm
    from pe_anchors.learner import build_model, set_data_config
    m = build_model('pe_vit_nano_patch2_16', 10, pe='rope', style='released', model_kwargs=dict(depth=2))
    assert type(m.pos_embed).__name__ == 'RoPE2D' and m.style == 'released' and len(m.blocks) == 2
    assert m.model_kwargs == dict(pe='rope', style='released', depth=2, num_classes=10)   # what a checkpoint rebuilds it from
    cnn = build_model('resnet10t', 7)
    assert cnn.num_classes == 7 and (cnn.model_name, cnn.model_kwargs) == ('resnet10t', dict(num_classes=7))
    vit = build_model('vit_tiny_patch16_224', 10, model_kwargs=dict(img_size=16, patch_size=4, depth=2))
    assert type(vit) is timm.models.vision_transformer.VisionTransformer        # timm's own PE, untouched
    for name, kw in (('resnet10t', dict(pe='ape')), ('vit_tiny_patch16_224', dict(rpt=True))):
        with pytest.raises(ValueError, match='is not a pe_vit model'): build_model(name, 10, **kw)
    m = set_data_config(m, small)
    assert (m.pretrained_cfg['mean'], m.pretrained_cfg['input_size']) == (tuple(small.mean), (3, 16, 16))
    with pytest.raises(ValueError, match='expects 8px images'): set_data_config(build_model('pe_vit_nano_patch1_8', 10), small)
    assert set_data_config(build_model('resnet10t', 10), small).pretrained_cfg['std'] == tuple(small.std)   # any size


def test_make_dls_and_make_optimizer(small):
    from pe_anchors.learner import build_model, make_dls, make_optimizer
    r = get_recipe('fast', bs=32)
    dls = make_dls(small, r, torch.device('cpu'))
    assert dls.train.bs == 32 and dls.valid.bs == 64 and dls.device.type == 'cpu'
    with pytest.raises(ValueError, match='larger than the'): make_dls(small, get_recipe('fast', bs=32), torch.device('cpu'), world=100)
    net = build_model('pe_vit_nano_patch2_16', 10, pe='ape', model_kwargs=dict(depth=2))
    opt_func, kinds = make_optimizer(net, get_recipe('fast', opt='adam'), torch.device('cpu'))
    assert kinds == list(param_groups(net)) and kinds[:3] == ['body', 'body_no_wd', 'position']
    opt = opt_func(pe_splitter(net), lr=1e-3)
    assert isinstance(opt.opt, torch.optim.Adam) and not isinstance(opt.opt, torch.optim.AdamW)
    assert opt.opt.defaults['fused'] is False                                   # fused only on CUDA unless asked


def test_fit_callbacks_and_logging(small, monkeypatch):
    from fastai.callback.progress import ProgressCallback
    from fastcore.basics import noop
    from pe_anchors.learner import DDP, DivergenceWarning, EpochLines, Progress, fit_callbacks, set_logging
    cpu, r = torch.device('cpu'), get_recipe('fast')                           # fast: bf16 and channels-last, CUDA only
    names = lambda cbs: [type(c).__name__ for c in cbs]
    assert names(fit_callbacks(r, cpu)) == ['DDP', 'DivergenceWarning']
    mine = Callback()
    assert names(fit_callbacks(r, cpu, rpt=True, rpt_mode='sample', seed=3, cbs=[mine])) == \
           ['DDP', 'DivergenceWarning', 'RPT', 'Callback']
    assert fit_callbacks(r, cpu, rpt=True, rpt_mode='sample', seed=3)[2].mode == 'sample'
    if torch.cuda.is_available():
        assert names(fit_callbacks(r, torch.device('cuda')))[-2:] == ['MixedPrecision', 'ChannelsLast']
    learn = pe_learner(small, 'ape', show_progress=False, model_kwargs=dict(depth=2), bs=32)
    monkeypatch.delenv('PE_ANCHORS_QUIET', raising=False)
    set_logging(learn, True); assert any(isinstance(c, Progress) for c in learn.cbs)
    set_logging(learn, None); assert isinstance(learn.logger, EpochLines)
    assert not any(isinstance(c, ProgressCallback) for c in learn.cbs)
    set_logging(learn, None, rank=1); assert learn.logger is noop
    monkeypatch.setenv('PE_ANCHORS_QUIET', '1'); set_logging(learn, None); assert learn.logger is noop


def test_run_config_and_open_run(small, tmp_path):
    from pe_anchors.learner import build_model, open_run, run_config
    r = get_recipe('fast', epochs=1, bs=32)
    cfg = run_config('rpt', 'ape', True, 'sample', 'pe_vit_nano_patch2_16', None, small, r, 3, 1, torch.device('cpu'))
    assert json.loads(json.dumps(cfg)) == cfg                                  # JSON-able, as config.json
    assert (cfg['condition'], cfg['rpt_mode'], cfg['seed'], cfg['num_classes'], cfg['recipe']['bs']) == ('rpt', 'sample', 3, 10, 32)
    assert run_config('ape', 'ape', False, 'sample', 'm', None, small, r, 0, 1, torch.device('cpu'))['rpt_mode'] is None
    net = build_model('pe_vit_nano_patch2_16', 10, pe='ape', model_kwargs=dict(depth=2))
    assert open_run(None, cfg, net) is None
    learn = pe_learner(small, 'ape', run_dir=tmp_path / 'run', show_progress=False, model_kwargs=dict(depth=2), epochs=1, bs=32)
    fit_recipe(learn)                                                           # one finished epoch in the run directory
    run = open_run(tmp_path / 'run', learn.config, learn.model)
    assert run.run_dir == tmp_path / 'run' and run.start_epoch == 1            # resumed after its last checkpoint
    run = open_run(tmp_path / 'run', learn.config, learn.model, resume=False)
    assert run.start_epoch == 0 and not (tmp_path / 'run' / 'checkpoints').exists()   # cleared


# ---------------------------------------------------------------- trackers (the `tracking` extra: tensorboard, wandb)
def _train_with(cb: str, out: Path, capsys) -> int:
    from pe_anchors.cli import main
    rc = main(['train', '--out', str(out), '--epochs', '1', '--bs', '256', '--cbs', cb, '--quiet', '--device', 'cpu'])
    assert rc == 0, capsys.readouterr().err
    assert len((out / 'metrics.csv').read_text().splitlines()) == 2            # the run's own record is unchanged
    return rc


def test_a_digits_run_with_tensorboard(tmp_path, capsys, monkeypatch):
    pytest.importorskip('tensorboard', reason='tensorboard is not installed (pip install "pe_anchors[tracking]")')
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    monkeypatch.chdir(tmp_path)                                                  # nothing written outside the run
    _train_with('tensorboard', tmp_path / 'run', capsys)
    logs = list((tmp_path / 'run' / 'tensorboard').glob('events.out.tfevents.*'))
    assert len(logs) == 1 and not (tmp_path / 'runs').exists()
    acc = EventAccumulator(str(logs[0])); acc.Reload()
    tags = acc.Tags()['scalars']
    assert {'train_loss', 'valid_loss', 'accuracy', 'lr_0'} <= set(tags), tags
    assert len(acc.Scalars('train_loss')) == 1437 // 256                         # one point per training step


def test_a_digits_run_with_wandb_offline(tmp_path, capsys, monkeypatch):
    pytest.importorskip('wandb', reason='wandb is not installed (pip install "pe_anchors[tracking]")')
    monkeypatch.setenv('WANDB_MODE', 'offline'); monkeypatch.setenv('WANDB_SILENT', 'true'); monkeypatch.chdir(tmp_path)
    _train_with('wandb', tmp_path / 'run', capsys)
    runs = list((tmp_path / 'run' / 'wandb').glob('offline-run-*'))
    assert len(runs) == 1 and list(runs[0].glob('*.wandb')), list((tmp_path / 'run').rglob('*'))
    import wandb
    assert wandb.run is None                                                     # finished after the fit


def test_wandb_online_needs_the_network_asked_for(tmp_path, capsys, monkeypatch):
    pytest.importorskip('wandb', reason='wandb is not installed (pip install "pe_anchors[tracking]")')
    from pe_anchors.cli import main
    from pe_anchors.core import NETWORK_ENV
    monkeypatch.delenv('WANDB_MODE', raising=False); monkeypatch.delenv(NETWORK_ENV, raising=False)
    rc = main(['train', '--out', str(tmp_path / 'run'), '--epochs', '1', '--cbs', 'wandb', '--quiet'])
    err = capsys.readouterr().err
    assert rc == 2 and 'Weights & Biases' in err and 'WANDB_MODE=offline' in err and '--allow-network' in err, err
    assert not (tmp_path / 'run').exists()                                       # refused before anything ran


def test_paper_recipe_builds_the_released_model():
    from pe_anchors.learner import pe_learner
    learn = pe_learner('digits', 'ape', recipe='paper', show_progress=False, device='cpu', epochs=1)
    assert learn.model.style == 'released' and learn.config['recipe']['model_style'] == 'released'
    assert pe_learner('digits', 'ape', show_progress=False, device='cpu').model.style == 'timm'


def test_divergence_without_a_run_directory_warns(small):
    with pytest.warns(UserWarning, match='training diverged at epoch 0'):
        train('ape', small, epochs=1, lr=1e6, **FAST)


def test_a_diverging_run_stops_with_a_message(small, tmp_path):
    with pytest.raises(ValueError, match='training diverged at epoch 0'):
        train('ape', small, run_dir=tmp_path / 'run', epochs=2, lr=1e6, **FAST)
    assert not (tmp_path / 'run' / 'final.json').exists()


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


def test_the_run_recorder_is_a_callback_from_the_start(small, tmp_path):
    """The recorder is in `learn.cbs` when the learner is built and keeps where the run stands; fastai's validate and
    get_preds send the fit's events too, and leave the run directory as it is."""
    from pe_anchors.learner import RunRecorder, run_recorder
    learn = pe_learner(small, 'ape', run_dir=tmp_path, epochs=1, **FAST)
    rec = run_recorder(learn)
    assert isinstance(rec, RunRecorder) and rec in learn.cbs and learn.run_recorder is rec and rec.start_epoch == 0
    assert run_recorder(pe_learner(small, 'ape', epochs=1, **FAST)) is None              # no run directory, no recorder
    fit_recipe(learn)
    files = {p: p.stat().st_mtime_ns for p in tmp_path.rglob('*') if p.is_file()}
    learn.validate(); learn.get_preds()
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob('*') if p.is_file()} == files
    assert rec.finished(1, learn.model) and fit_recipe(learn)['epochs'] == 1            # done: loaded, not fitted again
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob('*') if p.is_file()} == files
    again = pe_learner(small, 'ape', run_dir=tmp_path, epochs=1, **FAST)
    assert again.run_recorder.start_epoch == 1 and again.run_recorder.finished(1, again.model)
