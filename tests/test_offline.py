"""Offline means offline: every place that can name a model or weights (an experiment file, `--model`, a checkpoint's
metadata, `atlas` names, a Hub folder's config, `pretrained`) goes through one gate (`core.check_model_name`), which
reads the name as timm does, so every spelling timm accepts (any case, `hf_hub`, `hf-hub`, pretrained tags) is refused
at once without `--allow-network`. Each case runs under a socket that raises on connect: not one connection is tried."""
import json, socket
from pathlib import Path

import pytest

from conftest import cli, exp_file, nano_checkpoint

HUB = ['hf-hub:timm/resnet10t.tv_in1k', 'HF-HUB:timm/resnet10t.tv_in1k', 'Hf-Hub:timm/resnet10t.tv_in1k',
       'HF_HUB:timm/resnet10t.tv_in1k', 'hf_hub:timm/resnet10t.tv_in1k']      # every spelling timm reads as the Hub


@pytest.fixture
def no_network(monkeypatch) -> list:
    "A socket that raises on connect (and on a name lookup); every attempt recorded."
    seen = []
    def refuse(*a, **k): seen.append(a[:2]); raise OSError('no network in this test')
    monkeypatch.setattr(socket.socket, 'connect', lambda self, *a: refuse(*a))
    monkeypatch.setattr(socket.socket, 'connect_ex', lambda self, *a: refuse(*a))
    for name in ('getaddrinfo', 'create_connection'): monkeypatch.setattr(socket, name, refuse)
    monkeypatch.delenv('PE_ANCHORS_ALLOW_NETWORK', raising=False)
    return seen


def _hub_folder(t: Path, arch: str) -> Path:
    "A kept model whose Hub folder's config.json names `arch` as its architecture."
    import timm
    from pe_anchors.hub import save_hub
    hub = save_hub(timm.create_model('pe_vit_nano_patch2_16', pe='ape', num_classes=10), t / 'run' / 'model')
    cfg = json.loads((hub / 'config.json').read_text()); cfg['architecture'] = arch
    (hub / 'config.json').write_text(json.dumps(cfg))
    return t / 'run'


CASES = ([(f'experiment-file-{n}', lambda t, n=n: ['sweep', exp_file(t, model=n), '--out', t / 'o', '--quiet'], n) for n in HUB]
         + [(f'train-model-{n}', lambda t, n=n: ['train', '--model', n, '--condition', 'nope', '--out', t / 'o', '--quiet'], n)
            for n in HUB]
         + [(f'checkpoint-metadata-{n}', lambda t, n=n: ['analyze', nano_checkpoint(t, model_name=n), '--out', t / 'a', '--quiet'], n)
            for n in HUB]
         + [(f'atlas-{n}', lambda t, n=n: ['atlas', n, '--data-path', t / 'c.npz', '--out', t / 'o'], n)
            for n in HUB[1:2] + ['vit_tiny_patch16_224.augreg_in21k', 'vit_tiny_patch16_224']]
         + [('hub-folder-config', lambda t: ['analyze', _hub_folder(t, HUB[3]), '--out', t / 'a', '--quiet'], HUB[3]),
            ('pretrained-in-a-file', lambda t: ['sweep', exp_file(t, model='resnet10t', model_kwargs=dict(pretrained=True)),
                                                '--out', t / 'o', '--quiet'], 'pretrained weights of resnet10t')])


@pytest.mark.parametrize('argv, named', [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_every_named_model_is_refused_offline_at_once(tmp_path, capsys, no_network, argv, named):
    rc, err = cli(capsys, *argv(tmp_path))
    assert rc == 2 and named in err and '--allow-network' in err, err
    assert not no_network, no_network                                          # not one connection tried
    assert not (tmp_path / 'o').exists()                                        # refused before anything is written


def test_timm_names_that_are_not_hub_names_are_refused_in_one_line(tmp_path, capsys, no_network):
    "A repo id without its source prefix is no timm registry name (timm says so); a local folder stays local."
    from pe_anchors.core import check_model_name
    rc, err = cli(capsys, 'train', '--model', 'timm/vit_tiny_patch16_224', '--condition', 'nope', '--out', tmp_path / 'o')
    assert rc == 2 and 'timm/vit_tiny_patch16_224' in err and "hf-hub:" in err, err
    assert check_model_name('local-dir:/any/folder', pretrained=True) == 'local-dir'
    assert not no_network
