"""Sharing a model the timm way: `save_hub` writes a Hugging Face Hub folder (timm's `save_for_hf` layout plus a model
card) that `timm.create_model('local-dir:...')` rebuilds offline, for every PE family."""
import json

import pytest
import timm
import torch

import pe_anchors  # noqa: F401  (registers the pe_vit_* architectures)
from pe_anchors.pos_embed import PE_NAMES
from pe_anchors.vit import PEViT
from pe_anchors.hub import load_checkpoint, save_checkpoint, save_hub

STATS = dict(mean=(.1, .2, .3), std=(.4, .5, .6))


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv('HF_HUB_OFFLINE', '1')


def _trained_looking(pe, **kw):
    "A tiny pe_vit with every weight (position parameters included) moved off its initialisation, and training statistics."
    torch.manual_seed(0)
    m = timm.create_model('pe_vit_nano_patch1_8', pe=pe, num_classes=7, **kw)
    with torch.no_grad():
        for p in m.parameters(): p.add_(torch.randn_like(p) * .1)
    m.pretrained_cfg = {**m.pretrained_cfg, **STATS}                 # what the learner records
    return m.eval()


@pytest.mark.parametrize('pe', PE_NAMES)
def test_hub_round_trip_every_pe(pe, tmp_path):
    m = _trained_looking(pe)
    card = dict(condition=pe, data='digits', recipe=dict(epochs=3, lr=1e-3), accuracy=.8125, ssdc=[.1, -.2])
    out = save_hub(m, tmp_path / 'hub', card=card)
    assert sorted(p.name for p in out.iterdir()) == ['README.md', 'config.json', 'model.safetensors']   # no pickle
    cfg = json.loads((out / 'config.json').read_text())
    assert cfg['architecture'] == 'pe_vit_nano_patch1_8' and cfg['num_classes'] == 7
    assert cfg['model_args']['pe'] == pe and cfg['pe_anchors']['pe'] == pe
    assert cfg['pe_anchors']['pe_class'] == type(m.pos_embed).__name__
    assert cfg['pe_anchors']['pe_settings'] == json.loads(json.dumps(m.pos_embed.settings()))
    assert cfg['pe_anchors']['card']['accuracy'] == .8125
    assert tuple(cfg['pretrained_cfg']['mean']) == STATS['mean'] and tuple(cfg['pretrained_cfg']['std']) == STATS['std']
    back = timm.create_model(f'local-dir:{out}', pretrained=True).eval()
    assert type(back) is PEViT and back.pe == pe and back.num_classes == 7
    assert back.pos_embed.settings() == m.pos_embed.settings()
    assert tuple(back.pretrained_cfg['mean']) == STATS['mean'] and tuple(back.pretrained_cfg['std']) == STATS['std']
    x = torch.randn(3, 3, 8, 8)
    with torch.no_grad(): assert torch.equal(back(x), m(x))
    readme = (out / 'README.md').read_text()
    assert f"`{pe}`" in readme and '| accuracy | 0.8125 |' in readme and '| SSDC | 0.1, -0.2 |' in readme
    assert '| recipe | epochs=3, lr=0.001 |' in readme and "local-dir:" in readme and 'library_name: timm' in readme


@pytest.mark.parametrize('pe, pe_kwargs', [('rope', dict(theta=100.)), ('alibi', dict(slope_scheme='geometric')),
                                           ('rope_dinov3', dict(shift=.25, jitter=1.5, aug_draw='pass')),
                                           ('ape_rope', dict(ref_grid_size=4)), ('rpb', dict(shared=True)),
                                           ('peg', dict(kernel_size=5, after=1))])
def test_hub_keeps_pe_settings(pe, pe_kwargs, tmp_path):
    m = _trained_looking(pe, pe_kwargs=pe_kwargs)
    back = timm.create_model(f'local-dir:{save_hub(m, tmp_path / "hub")}', pretrained=True).eval()
    assert back.pos_embed.settings() == m.pos_embed.settings()
    for k, v in pe_kwargs.items():
        got = getattr(back.pos_embed, k)
        assert (tuple(got) if isinstance(got, (list, tuple)) else got) == ((v, v) if k == 'ref_grid_size' else v)
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad(): assert torch.equal(back(x), m(x))


def test_hub_new_head_and_architecture_only(tmp_path):
    m = _trained_looking('rope')
    out = save_hub(m, tmp_path / 'hub')
    tuned = timm.create_model(f'local-dir:{out}', pretrained=True, num_classes=3)          # fine-tuning: a new head
    assert tuned.head.out_features == 3 and tuned.pretrained_cfg['num_classes'] == 3
    sd = m.state_dict()
    assert all(torch.equal(v, sd[k]) for k, v in tuned.state_dict().items() if not k.startswith('head.'))
    bare = timm.create_model(f'local-dir:{out}')                                           # timm's default: no weights
    assert {k: v.shape for k, v in bare.state_dict().items()} == {k: v.shape for k, v in sd.items()}
    assert not torch.equal(bare.blocks[0].attn.qkv.weight, sd['blocks.0.attn.qkv.weight'])
    assert tuple(bare.pretrained_cfg['mean']) == STATS['mean']                              # the data config still applies


def test_hub_from_a_checkpoint_and_a_resized_model(tmp_path):
    m = _trained_looking('ape_rope')
    m.set_input_size(16)                                                 # 16x16 grid: the APE table is resampled
    c = load_checkpoint(save_checkpoint(m, tmp_path / 'm.safetensors')).eval()
    back = timm.create_model(f'local-dir:{save_hub(c, tmp_path / "hub")}', pretrained=True).eval()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad(): assert torch.equal(back(x), m(x))
    assert back.pretrained_cfg['input_size'] == (3, 16, 16)


def test_hub_learner_statistics(tmp_path):
    from timm.data import resolve_data_config
    from pe_anchors.learner import pe_learner
    learn = pe_learner('digits', 'rope', show_progress=False, device='cpu')
    net = learn.model
    out = save_hub(net, tmp_path / 'hub', card=dict(condition='rope', data='digits'))
    back = timm.create_model(f'local-dir:{out}', pretrained=True).eval()
    cfg = resolve_data_config(model=back)
    assert tuple(cfg['mean']) == tuple(net.pretrained_cfg['mean']) and tuple(cfg['std']) == tuple(net.pretrained_cfg['std'])
    from pe_anchors.data import get_data
    data = get_data('digits')                                            # the statistics the learner trained with
    assert tuple(cfg['mean']) == tuple(data.mean) and tuple(cfg['std']) == tuple(data.std)
    assert tuple(data.mean) != tuple(timm.create_model('pe_vit_nano_patch2_16').pretrained_cfg['mean'])
    assert cfg['input_size'] == net.pretrained_cfg['input_size']


def test_hub_refuses_unknown_models_and_full_folders(tmp_path):
    m = _trained_looking('ape')
    (tmp_path / 'full').mkdir(); (tmp_path / 'full' / 'x').write_text('keep me')
    with pytest.raises(FileExistsError, match='not an empty folder'): save_hub(m, tmp_path / 'full')
    assert (tmp_path / 'full' / 'x').read_text() == 'keep me'
    (tmp_path / 'empty').mkdir()
    assert (save_hub(m, tmp_path / 'empty') / 'config.json').exists()               # an empty folder is fine
    raw = PEViT(img_size=8, patch_size=1, embed_dim=32, depth=1, num_heads=2, pe='rope')
    with pytest.raises(ValueError, match='does not record how it was built'): save_hub(raw, tmp_path / 'raw')
    assert not (tmp_path / 'raw').exists() and not list(tmp_path.glob('.raw*'))
    with pytest.raises(ValueError, match='no published weights'): timm.create_model('pe_vit_nano_patch1_8', pretrained=True)


def test_hub_any_timm_model(tmp_path):
    "A baseline the learner trains (any timm model built by name) is shared the same way, without a PE entry."
    torch.manual_seed(0)
    cnn = timm.create_model('resnet10t', num_classes=5).eval()
    cnn.model_name, cnn.model_kwargs = 'resnet10t', dict(num_classes=5)
    out = save_hub(cnn, tmp_path / 'hub', card=dict(condition='cnn'))
    assert 'pe' not in json.loads((out / 'config.json').read_text())['pe_anchors']
    back = timm.create_model(f'local-dir:{out}', pretrained=True).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad(): assert torch.equal(back(x), cnn(x))


@pytest.mark.parametrize('pe', PE_NAMES)
def test_safetensors_round_trip(tmp_path, pe):
    m = timm.create_model('pe_vit_tiny_patch4_32', pe=pe, num_classes=3).eval()
    path = save_checkpoint(m, tmp_path / 'm.safetensors', extra={'epoch': 4})
    m2 = load_checkpoint(path).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad(): assert torch.equal(m(x), m2(x))
    with pytest.raises(FileNotFoundError): load_checkpoint(tmp_path / 'missing.safetensors')
