"""Shared pytest configuration for pe_anchors.

Run in parallel with pytest-xdist (`pytest -n 2 tests`, as CI does): each worker then takes its share of the
cores as torch threads. Markers: `slow` (long CPU tests, run by default; deselect with -m "not slow") and `cuda` (needs a GPU: skipped,
visibly, when none is present). Real-data tests read CIFAR-10 from the paths in the environment variables
PE_ANCHORS_CIFAR_DIR (ImageNet-style folder with train/ and val/) and PE_ANCHORS_CIFAR_NPZ (the packed npz), or from
the options --cifar-dir / --cifar-npz (which win); without either, those tests are skipped and say which to set.
"""
import json, os
from pathlib import Path
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]

def pytest_addoption(parser):
    parser.addoption('--cifar-dir', default=None, help='CIFAR-10 as an ImageNet-style folder (else $PE_ANCHORS_CIFAR_DIR)')
    parser.addoption('--cifar-npz', default=None, help='CIFAR-10 packed as an npz (else $PE_ANCHORS_CIFAR_NPZ)')

def pytest_configure(config):
    workers = int(os.environ.get('PYTEST_XDIST_WORKER_COUNT', '1'))      # under pytest-xdist (-n N): share the cores
    if workers > 1: torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))
    config.addinivalue_line('markers', 'slow: long-running test (CPU); deselect with -m "not slow"')
    config.addinivalue_line('markers', 'cuda: needs a CUDA GPU; skipped when none is available')

def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available(): return
    skip = pytest.mark.skip(reason='needs a CUDA GPU (none available on this machine)')
    for item in items:
        if 'cuda' in item.keywords: item.add_marker(skip)

def _data_path(config, option: str, env: str) -> Path | None:
    p = config.getoption(option) or os.environ.get(env)
    return Path(p) if p else None

@pytest.fixture(scope='session')
def cifar_dir(pytestconfig):
    "CIFAR-10 as an ImageNet-style folder (train/<class>/*.jpg, val/<class>/*.jpg), or skip."
    p = _data_path(pytestconfig, '--cifar-dir', 'PE_ANCHORS_CIFAR_DIR')
    if p is None: pytest.skip('CIFAR-10 folder not given: pass --cifar-dir or set PE_ANCHORS_CIFAR_DIR')
    if not p.exists(): pytest.skip(f'CIFAR-10 folder {p} does not exist (--cifar-dir / PE_ANCHORS_CIFAR_DIR)')
    return p

@pytest.fixture(scope='session')
def cifar_npz(pytestconfig):
    "CIFAR-10 packed as JPEG bytes in an npz ({train,val}_jpeg, _offsets, _labels, classes), or skip."
    p = _data_path(pytestconfig, '--cifar-npz', 'PE_ANCHORS_CIFAR_NPZ')
    if p is None: pytest.skip('CIFAR-10 npz not given: pass --cifar-npz or set PE_ANCHORS_CIFAR_NPZ')
    if not p.exists(): pytest.skip(f'CIFAR-10 npz {p} does not exist (--cifar-npz / PE_ANCHORS_CIFAR_NPZ)')
    return p

@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def fake_run(out: Path, exp, condition: str, seed: int, folder: str | None = None, name: str | None = None,
             **recipe_overrides) -> Path:
    "A finished run of `exp` as `run_experiment` leaves it (the learner's own config, a results table), without training."
    from pe_anchors.data import get_data
    from pe_anchors.learner import pe_learner
    from pe_anchors.results import result_frame, write_results
    d = Path(out) / 'runs' / (folder or f'{condition}-s{seed}')
    learn = pe_learner(get_data(exp.data, **exp.data_kwargs), condition, recipe=exp.recipe, seed=seed, model=exp.model,
                       model_kwargs=exp.model_kwargs, show_progress=False, **{**exp.train_kwargs, **recipe_overrides})
    (d / 'train').mkdir(parents=True, exist_ok=True)
    (d / 'train' / 'config.json').write_text(json.dumps(learn.config, indent=2))
    rows = [dict(metric='acc', shift='clean', value=.5 + .1 * seed), dict(metric='ssdc', mode='normal', layer=0, value=.3)]
    write_results(result_frame(rows, experiment=name or exp.name, dataset='digits', condition=condition, seed=seed),
                  d / 'results.csv')
    return d


# ---------------------------------------------------------------- small training fixtures shared by the test files
FAST = dict(model_kwargs=dict(depth=1), show_progress=False, bs=64)   # one block, quiet: seconds per epoch on digits


@pytest.fixture(scope='session')
def small():
    "256 training and 64 validation digits: enough for a few quick epochs."
    import dataclasses
    from pe_anchors.data import ImageSplit, digits
    d = digits()
    return dataclasses.replace(d, train=ImageSplit(d.train.labels[:256], images=d.train.images[:256]),
                               valid=ImageSplit(d.valid.labels[:64], images=d.valid.images[:64]))


def stop_after(epoch: int):
    "A fastai callback that interrupts training (KeyboardInterrupt) at the end of `epoch`, after the run's checkpoint."
    from fastai.callback.core import Callback
    class StopAfter(Callback):
        order = 99                                                      # after the run recorder's checkpoint
        def after_epoch(self):
            if self.epoch == epoch: raise KeyboardInterrupt
    return StopAfter()


def weights(model) -> dict:
    "A detached copy of a model's state dict."
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


# ---------------------------------------------------------------- the command line in this process, and no network
def cli(capsys, *args) -> tuple[int, str]:
    "Run the command line in this process: (exit code, its one stderr line); more than one line fails the test."
    from pe_anchors.cli import main
    try: rc = main([str(a) for a in args])
    except SystemExit as e: rc = e.code                                     # argparse's own usage errors
    lines = [l for l in capsys.readouterr().err.splitlines() if l.strip()]
    assert len(lines) <= 1 and not any('Traceback' in l for l in lines), lines
    return rc, lines[0] if lines else ''


@pytest.fixture
def lookups(monkeypatch) -> list:
    "Every DNS lookup or connection attempted (each refused): none is expected."
    import socket
    seen = []
    def refuse(*a, **k): seen.append(a[:2]); raise OSError('no network in this test')
    for name in ('getaddrinfo', 'create_connection'): monkeypatch.setattr(socket, name, refuse)
    return seen


# ---------------------------------------------------------------- small experiments, checkpoints and models
def tiny(**kw):
    "APE and NoPE on digits, one epoch of a two-block model, a small measurement: what fake runs and quick sweeps are made of."
    from pe_anchors.config import preset
    base = dict(conditions=['ape', 'nope'], seeds=[0], train_kwargs=dict(epochs=1), ssdc_images=32, n_perms=1, alphas=[],
                model_kwargs=dict(depth=2))
    return preset('digits', **{**base, **kw})


def tiny_two_seeds(**kw):
    "`tiny` over seeds 0 and 1."
    return tiny(**{'seeds': [0, 1], **kw})


def tiny_two_conditions(**kw):
    "NoPE and APE on digits, one epoch, 48 SSDC images, 2 draws, α at 1 and 0: a quick sweep that measures everything."
    from pe_anchors.config import preset
    base = dict(conditions=['nope', 'ape'], train_kwargs=dict(epochs=1), ssdc_images=48, n_perms=2, alphas=[1., 0.],
                model_kwargs=dict(depth=2))
    return preset('digits', **{**base, **kw})


@pytest.fixture(scope='session')
def digits():
    "The digits dataset (as the digits preset's data without its background)."
    from pe_anchors.data import get_data
    return get_data('digits')


def exp_file(tmp: Path, **fields) -> Path:
    "A small digits experiment file (YAML) with `fields` changed."
    import yaml
    d = {**tiny().to_dict(), **fields}
    p = tmp / 'e.yaml'; p.write_text(yaml.safe_dump(d, sort_keys=False))
    return p


def nano_checkpoint(tmp: Path, name: str = 'ape.safetensors', **meta) -> Path:
    "A digits-sized (16 px) pe_vit checkpoint, its metadata changed by `meta`."
    import timm
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file
    from pe_anchors.hub import save_checkpoint
    p = save_checkpoint(timm.create_model('pe_vit_nano_patch2_16', pe='ape', num_classes=10), tmp / name)
    if meta:
        with safe_open(str(p), 'pt') as f: old = f.metadata()
        save_file(load_file(str(p)), str(p), metadata={**old, **meta})
    return p


def hold_lock(path: Path, shared: bool = False):
    "Another process holding `path`'s RunLock (until killed); returns it once it holds the lock."
    import subprocess, sys
    probe = (f"from pe_anchors.rundir import RunLock; import time\n"
             f"with RunLock({str(path)!r}, shared={shared}) as l: print(l.acquired, flush=True); time.sleep(120)")
    holder = subprocess.Popen([sys.executable, '-c', probe], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == 'True'
    return holder


def small_vit(pe: str, seed: int = 0, **kw):
    "A 16 px PEViT of 3 blocks (width 32, 2 heads, 5 classes) with PE `pe`, seeded, in eval mode."
    from pe_anchors.vit import PEViT
    torch.manual_seed(seed)
    return PEViT(img_size=16, patch_size=2, embed_dim=32, depth=3, num_heads=2, num_classes=5, pe=pe, **kw).eval()


def sharpen(m, pe_scale: float = 30.):
    "Make position matter at initialisation: larger position parameters and sharper attention."
    with torch.no_grad():
        for p in m.pos_embed.parameters(): p.mul_(pe_scale)
        if hasattr(m.pos_embed, 'slopes'): m.pos_embed.slopes.mul_(pe_scale)      # ALiBi's fixed slopes
        for blk in m.blocks: blk.attn.qkv.weight.mul_(10)
    return m
