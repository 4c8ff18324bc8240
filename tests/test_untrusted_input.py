"""Files from someone else run no code and nothing reaches the network unasked: pickles in checkpoints and Hub
folders, callbacks named in experiment files, downloads."""
import json, os, pickle, warnings

import pytest
import torch

import pe_anchors  # noqa: F401
from pe_anchors.config import Experiment
from pe_anchors.sweep import run_experiment
from pe_anchors.learner import train, make_callbacks
from pe_anchors.rundir import TrainDir

from conftest import FAST, stop_after, cli, tiny


class _Payload:
    def __reduce__(self): return (os.system, (f"touch {os.environ['PAYLOAD_FLAG']}",))


def test_a_planted_pickle_payload_is_not_executed(small, tmp_path, monkeypatch):
    flag = tmp_path / 'pwned'
    monkeypatch.setenv('PAYLOAD_FLAG', str(flag))
    run = tmp_path / 'run'
    with pytest.raises(KeyboardInterrupt): train('ape', small, run_dir=run, epochs=3, cbs=[stop_after(1)], **FAST)
    for ck in TrainDir(run).checkpoints(): torch.save({'epoch': 0, 'evil': _Payload()}, ck / 'state.pt')
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter('always')
        out = train('ape', small, run_dir=run, epochs=3, **FAST)
    assert not flag.exists()                                                    # nothing was executed
    assert out['learn'].run_recorder.start_epoch == 0 and any('unreadable' in str(x.message) for x in w)   # said, and restarted


def test_a_pickle_named_safetensors(tmp_path, capsys):
    f = tmp_path / 'model.safetensors'
    f.write_bytes(pickle.dumps({'weights': [1, 2, 3]}))
    rc, err = cli(capsys, 'analyze', f, '--out', tmp_path / 'a')
    assert rc == 2 and str(f) in err and 'not a safetensors file' in err, err


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
