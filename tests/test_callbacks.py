"""Callbacks that keep the run whole: every name `--cbs` offers (`learner.CALLBACKS`) trains a run killed after its
first epoch and resumed to the same end as a run never killed, writing only inside the run directory; early stopping
ends a run as finished (final model, final.json saying where it stopped, a later call that finds it finished)."""
import json
from functools import partialmethod
from pathlib import Path

import pytest
import torch

import pe_anchors.learner as L
from pe_anchors.learner import CALLBACKS, make_callbacks, train

from conftest import FAST, cli, stop_after

NEEDS = {'tensorboard': 'tensorboard', 'wandb': 'wandb'}                  # the `tracking` extra


def _stops_at_epoch_1(cbs):
    "Early stopping that finds no improvement after epoch 0 (a margin of 10 on the valid loss): it stops after epoch 1."
    for cb in cbs:
        if isinstance(cb, L.EarlyStopping): cb.min_delta = -10.
    return cbs


def _fit(name: str, small, run: Path, kill_after: int | None = None) -> dict:
    cbs = _stops_at_epoch_1(make_callbacks([name])) + ([stop_after(kill_after)] if kill_after is not None else [])
    return train('ape', small, run_dir=run, epochs=3, seed=1, cbs=cbs, **FAST)


def _files(run: Path) -> dict:
    "What a run wrote besides its checkpoints and clocks: each file's tensors (weights) or its lines without times."
    out = {}
    for p in sorted(run.rglob('*')):
        rel = str(p.relative_to(run))
        if not p.is_file() or rel.startswith(('checkpoints', '.lock', 'wandb', 'tensorboard')) or p.name in ('final.json', 'config.json'): continue
        if p.suffix == '.safetensors':
            from safetensors.torch import load_file
            out[rel] = load_file(str(p))
        elif p.suffix == '.pth': out[rel] = torch.load(p, weights_only=True)
        elif p.suffix == '.csv':                                         # the time columns aside
            rows = [l.split(',') for l in p.read_text().splitlines()]
            keep = [i for i, h in enumerate(rows[0]) if h not in ('time', 'time_s', 'train_img_s')]
            out[rel] = [[r[i] for i in keep] for r in rows]
        else: out[rel] = p.read_bytes()
    return out


def _same(a: dict, b: dict):
    assert a.keys() == b.keys(), (a.keys(), b.keys())
    for k in a:
        if isinstance(a[k], dict): assert all(torch.equal(a[k][t], b[k][t]) for t in a[k]), k
        else: assert a[k] == b[k], k


@pytest.mark.parametrize('name', list(CALLBACKS))
def test_every_registered_callback_survives_a_kill_and_keeps_to_its_run(name, small, tmp_path, monkeypatch):
    if name in NEEDS: pytest.importorskip(NEEDS[name], reason=f'{NEEDS[name]} is not installed (pip install "pe_anchors[tracking]")')
    if name == 'wandb': monkeypatch.setenv('WANDB_MODE', 'offline'); monkeypatch.setenv('WANDB_SILENT', 'true')
    monkeypatch.chdir(tmp_path)
    whole = _fit(name, small, tmp_path / 'whole')
    with pytest.raises(KeyboardInterrupt): _fit(name, small, tmp_path / 'cut', kill_after=0)
    resumed = _fit(name, small, tmp_path / 'cut')
    assert sorted(p.name for p in tmp_path.iterdir()) == ['cut', 'whole']        # nothing written outside the runs
    _same(_files(tmp_path / 'whole'), _files(tmp_path / 'cut'))                   # the same run, killed or not
    for k in ('epochs', 'accuracy', 'valid_loss', 'stopped_early'): assert whole.get(k) == resumed.get(k), k
    run = tmp_path / 'cut'
    expect = {'csv': lambda: len((run / 'history.csv').read_text().splitlines()) == 1 + 3,
              'save_model': lambda: (run / 'models' / 'model.pth').exists(),
              'early_stopping': lambda: resumed['stopped_early'] and resumed['epochs'] == 2 and resumed['planned_epochs'] == 3,
              'snapshots': lambda: sorted(L.TrainDir(run).snapshots()) == [0, 1, 2],
              'tensorboard': lambda: len(list((run / 'tensorboard').glob('events.out.tfevents.*'))) == 2,
              'wandb': lambda: len(list((run / 'wandb').glob('offline-run-*'))) == 2}
    assert name in expect, f"the callback {name!r} has no end-to-end expectation here: add one"
    assert expect[name](), name


def test_early_stopping_finishes_the_run_from_the_command_line(tmp_path, capsys, monkeypatch):
    "The issue's case: the run stops early, is finished (final model and record), and a second call says so."
    monkeypatch.setattr(L.EarlyStopping, '__init__', partialmethod(L.EarlyStopping.__init__, min_delta=10.))
    monkeypatch.chdir(tmp_path)
    argv = ['train', '--out', tmp_path / 'r3', '--epochs', '4', '--bs', '256', '--cbs', 'early_stopping', 'csv',
            'save_model', '--quiet', '--device', 'cpu']
    rc, err = cli(capsys, *argv)
    assert rc == 0, err
    final = json.loads((tmp_path / 'r3' / 'final.json').read_text())
    assert final['stopped_early'] and final['epochs'] == 2 and (tmp_path / 'r3' / 'model.safetensors').exists(), final
    assert (tmp_path / 'r3' / 'history.csv').exists() and (tmp_path / 'r3' / 'models' / 'model.pth').exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ['r3']                 # no history.csv, no models/ here
    from pe_anchors.cli import main
    rc = main([str(a) for a in argv])
    text, err = capsys.readouterr()
    out = json.loads(text[text.index('\n{') + 1:] if not text.startswith('{') else text)   # after fastai's own lines
    assert rc == 0 and out['already_finished'] and out['stopped_early'] and out['epochs'] == 2, (err, out)
