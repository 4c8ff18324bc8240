"""The PE families beyond the paper (RPB, APE+RoPE, DINOv3 RoPE, PEG, ALiBi): references, NoPE limits, no
permutation equivariance, checkpoints, resolution changes, and every analysis running on them unchanged."""

import numpy as np
import pytest
import timm
import torch
import torch.nn.functional as F

import pe_anchors  # noqa: F401
from pe_anchors.core import CONDITIONS, EXTENSION_CONDITIONS
from pe_anchors.hooks import TokenPermutation
from pe_anchors.hub import save_checkpoint, load_checkpoint

from conftest import sharpen, small_vit

NEW = ('rpb', 'ape_rope', 'rope_dinov3', 'peg', 'alibi')


def test_conditions_and_names():
    for c in NEW: assert c in CONDITIONS and c in EXTENSION_CONDITIONS and CONDITIONS[c]['pe'] == c
    for c in NEW: assert timm.create_model('pe_vit_nano_patch2_16', pe=c).pos_embed is not None


@pytest.mark.parametrize('pe', ['rpb', 'peg', 'alibi'])
def test_zero_position_parameters_are_nope(pe):
    x = torch.randn(2, 3, 16, 16)
    m, nope = small_vit(pe), small_vit('none')
    nope.load_state_dict({k: v for k, v in m.state_dict().items() if not k.startswith('pos_embed.')})
    with torch.no_grad():
        if pe == 'alibi': m.pos_embed.slopes.zero_()
        else:
            for p in m.pos_embed.parameters(): p.zero_()
        torch.testing.assert_close(m(x), nope(x))


@pytest.mark.parametrize('pe', NEW)
def test_not_permutation_equivariant(pe):
    m = sharpen(small_vit(pe))
    x = torch.randn(2, 3, 16, 16)
    perm = torch.randperm(64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        base = m(x)
        with TokenPermutation(m, perm=perm): out = m(x)
    assert ((out - base).norm() / base.norm()) > .02, pe
    nope = small_vit('none')
    with torch.no_grad(), TokenPermutation(nope, perm=perm): torch.testing.assert_close(nope(x), small_vit('none')(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize('pe', NEW)
def test_checkpoint_round_trip(pe, tmp_path):
    m = timm.create_model('pe_vit_nano_patch2_16', pe=pe)
    with torch.no_grad():
        for p in m.pos_embed.parameters(): p.add_(torch.randn_like(p))
    save_checkpoint(m, tmp_path / 'm.safetensors')
    back = load_checkpoint(tmp_path / 'm.safetensors').eval()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad(): torch.testing.assert_close(back(x), m.eval()(x))


def test_resized_model_checkpoint_rebuilds_it(tmp_path):
    m = timm.create_model('pe_vit_nano_patch2_16', pe='ape_rope', num_classes=5)
    m.pos_embed.ref_grid_size = m.pos_embed.grid_size
    m.set_input_size(32); m.eval()
    back = load_checkpoint(save_checkpoint(m, tmp_path / 'm.safetensors')).eval()
    assert back.pos_embed.ref_grid_size == (8, 8) and back.grid_size == (16, 16)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad(): assert torch.equal(back(x), m(x))


@pytest.mark.parametrize('pe', NEW)
def test_every_analysis_runs(pe):
    from pe_anchors.interventions import measure_ssdc, alpha_sweep, pe_table_ssdc
    from pe_anchors.robustness import evaluate_accuracy, make_shift
    from pe_anchors.mech.position import fit_position_probes, layer_tokens
    m = sharpen(small_vit(pe))
    g = torch.Generator().manual_seed(0)
    x = F.interpolate(torch.randn(24, 3, 4, 4, generator=g), size=16, mode='bilinear', align_corners=False)
    batches = [x[:12], x[12:]]
    assert measure_ssdc(m, batches).values.shape == (1, 3)
    runs = measure_ssdc(m, batches, 'rpi', n_perms=2)
    assert runs.values.shape == (2, 3) and np.isfinite(runs.values).all()
    sweep = alpha_sweep(m, batches, alphas=(1., 0.), n_perms=2)
    assert set(sweep.alpha) == {1., 0.}
    u8 = (x.clamp(-2, 2) * 60 + 128).to(torch.uint8)
    acc = evaluate_accuracy(m, [(u8, torch.zeros(24, dtype=torch.long))], normalize=((.5,) * 3, (.25,) * 3),
                            shift=make_shift('jpeg'))
    assert 0 <= acc <= 1
    probes = fit_position_probes(layer_tokens(m, batches, 1), m.grid_size, steps=20)
    assert set(probes.table.target) == {'position', 'row', 'col'}
    if pe == 'ape_rope': assert abs(pe_table_ssdc(m)) < 1                                  # its table has a structure
    if pe in ('ape_rope', 'rope_dinov3'):
        from pe_anchors.mech.position import rope_knockout
        with torch.no_grad():
            base = m(x)
            with rope_knockout(m, 'all'): out = m(x)
        assert not torch.allclose(base, out)
