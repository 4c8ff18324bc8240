"""Shared pytest configuration for pe_anchors.

Markers: `slow` (long CPU tests, run by default; deselect with -m "not slow") and `cuda` (needs a GPU: skipped,
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
