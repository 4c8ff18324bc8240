"""The PE families beyond the paper (RPB, APE+RoPE, DINOv3 RoPE, PEG, ALiBi): references, NoPE limits, no
permutation equivariance, checkpoints, resolution changes, and every analysis running on them unchanged."""
import math

import numpy as np
import pytest
import timm
import torch
import torch.nn.functional as F

import pe_anchors  # noqa: F401
from pe_anchors.core import CONDITIONS, EXTENSION_CONDITIONS, grid_coords
from pe_anchors.pos_embed import APERoPE, RoPEDinoV3, alibi_slopes
from pe_anchors.vit import PEViT, TokenPermutation, save_checkpoint, load_checkpoint

NEW = ('rpb', 'ape_rope', 'rope_dinov3', 'peg', 'alibi')


def vit(pe, seed=0, **kw):
    torch.manual_seed(seed)
    return PEViT(img_size=16, patch_size=2, embed_dim=32, depth=3, num_heads=2, num_classes=5, pe=pe, **kw).eval()


def sharpen(m, pe_scale=30.):
    "Make position matter at initialisation: larger position parameters and sharper attention."
    with torch.no_grad():
        for p in m.pos_embed.parameters(): p.mul_(pe_scale)
        if hasattr(m.pos_embed, 'slopes'): m.pos_embed.slopes.mul_(pe_scale)      # ALiBi's fixed slopes
        for blk in m.blocks: blk.attn.qkv.weight.mul_(10)
    return m


def test_conditions_and_names():
    for c in NEW: assert c in CONDITIONS and c in EXTENSION_CONDITIONS and CONDITIONS[c]['pe'] == c
    for c in NEW: assert timm.create_model('pe_vit_nano_patch2_16', pe=c).pos_embed is not None


def test_attention_with_a_bias_against_a_written_out_softmax():
    m = sharpen(vit('rpb'))
    x = torch.randn(2, 3, 16, 16)
    blk, attn = m.blocks[1], m.blocks[1].attn
    tokens = m._embed(x)
    tokens = m.blocks[0](tokens, attn_bias=m.pos_embed.attn_bias(0))
    h = blk.norm1(tokens)
    q, k, v = attn._qkv(h).unbind(0)
    bias = m.pos_embed.attn_bias(1)
    logits = torch.einsum('bhnd,bhmd->bhnm', q, k) / math.sqrt(attn.head_dim) + bias
    want = attn.proj((logits.softmax(-1) @ v).transpose(1, 2).reshape(2, -1, 32))
    torch.testing.assert_close(attn(h, attn_bias=bias), want, atol=1e-5, rtol=1e-5)
    attn.fused_attn = False
    torch.testing.assert_close(attn(h, attn_bias=bias), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize('pe', ['rpb', 'peg', 'alibi'])
def test_zero_position_parameters_are_nope(pe):
    x = torch.randn(2, 3, 16, 16)
    m, nope = vit(pe), vit('none')
    nope.load_state_dict({k: v for k, v in m.state_dict().items() if not k.startswith('pos_embed.')})
    with torch.no_grad():
        if pe == 'alibi': m.pos_embed.slopes.zero_()
        else:
            for p in m.pos_embed.parameters(): p.zero_()
        torch.testing.assert_close(m(x), nope(x))


def test_ape_rope_alphas_act_separately():
    m = vit('ape_rope')
    x = torch.randn(2, 3, 16, 16)
    ape, rope = vit('ape'), vit('rope')
    sd = m.state_dict()
    ape.load_state_dict({**{k: v for k, v in sd.items() if not k.startswith('pos_embed.')}, 'pos_embed.pos_embed': sd['pos_embed.ape.pos_embed']})
    rope.load_state_dict({k: v for k, v in sd.items() if not k.startswith('pos_embed.')})
    with torch.no_grad():
        with m.pos_embed.scaled(0., part='rope'): torch.testing.assert_close(m(x), ape(x))     # RoPE off: the APE model
        with m.pos_embed.scaled(0., part='ape'): torch.testing.assert_close(m(x), rope(x))     # table off: the RoPE model
    assert m.pos_embed.alpha_ape == m.pos_embed.alpha_rope == 1.
    m.pos_embed.alpha = .5
    assert m.pos_embed.alpha_ape == m.pos_embed.alpha_rope == .5


@pytest.mark.parametrize('pe', NEW)
def test_not_permutation_equivariant(pe):
    m = sharpen(vit(pe))
    x = torch.randn(2, 3, 16, 16)
    perm = torch.randperm(64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        base = m(x)
        with TokenPermutation(m, perm=perm): out = m(x)
    assert ((out - base).norm() / base.norm()) > .02, pe
    nope = vit('none')
    with torch.no_grad(), TokenPermutation(nope, perm=perm): torch.testing.assert_close(nope(x), vit('none')(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize('pe', NEW)
def test_checkpoint_round_trip(pe, tmp_path):
    m = timm.create_model('pe_vit_nano_patch2_16', pe=pe)
    with torch.no_grad():
        for p in m.pos_embed.parameters(): p.add_(torch.randn_like(p))
    save_checkpoint(m, tmp_path / 'm.safetensors')
    back = load_checkpoint(tmp_path / 'm.safetensors').eval()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad(): torch.testing.assert_close(back(x), m.eval()(x))


def test_resolution_change_resizes_tables():
    m = vit('rpb')
    old = m.pos_embed.tables[0].relative_position_bias_table.shape
    m.set_input_size(32)
    assert m.grid_size == (16, 16) and m.pos_embed.tables[0].relative_position_bias_table.shape == ((2 * 16 - 1) ** 2 + 3, old[1])
    assert m(torch.randn(1, 3, 32, 32)).shape == (1, 5)
    a = vit('ape'); t0 = a.pos_embed.pos_embed.detach().clone()
    a.set_input_size(32)
    assert a.pos_embed.pos_embed.shape == (1, 1 + 256, 32) and torch.equal(a.pos_embed.pos_embed[:, :1], t0[:, :1])
    r = vit('rope_dinov3'); r.set_input_size(32)
    c = r.pos_embed.coords
    assert c.shape == (256, 2) and c.min() > -1 and c.max() < 1
    al = vit('alibi'); al.set_input_size(32)
    assert al.pos_embed.attn_bias().shape == (1, 2, 257, 257)


def test_dinov3_coordinate_augmentation_only_in_training():
    m = vit('rope_dinov3')
    pe = m.pos_embed
    x = torch.randn(1, 3, 16, 16)
    m.eval(); m(x); a0 = pe.base_angles().clone()
    m.train(); torch.manual_seed(1); m(x); a1 = pe.base_angles().clone()
    assert not torch.allclose(a0, a1)
    valid = a0.abs() > 1e-3
    ratio = a1[valid] / a0[valid]
    assert torch.allclose(ratio, ratio[0], rtol=1e-4) and ratio[0] != 1                     # one global rescale, no shift
    m.eval(); m(x); torch.testing.assert_close(pe.base_angles(), a0)


@pytest.mark.parametrize('pe', NEW)
def test_every_analysis_runs(pe):
    from pe_anchors.interventions import measure_ssdc, alpha_sweep, pe_table_ssdc
    from pe_anchors.robustness import evaluate_accuracy, make_shift
    from pe_anchors.mech.position import fit_position_probes, layer_tokens
    m = sharpen(vit(pe))
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
