"Position probes, retention and rotary-plane knockouts: pe_anchors models and timm's own ViT / Eva models."
import itertools, warnings

import numpy as np
import pytest
import timm
import torch

import pe_anchors  # noqa: F401  (registers the pe_vit_* models)
from pe_anchors.mech.position import (POSITION_TARGETS, PositionProbe, fit_position_probes, grid_permutation,
                                    knockout_mask, layer_tokens, permutation_sensitivity, position_labels,
                                    position_removed, retention, rope_knockout, rotary_axes, split_images,
                                    withheld_retention)
from pe_anchors.hooks import TokenRecorder

ROWS_4 = [2, 0, 3, 1]
COLS_4 = [1, 3, 0, 2]


def _timm(name, **kw):
    "A small random-weight timm model on a 4x4 grid, layer scale off so attention changes the outputs visibly."
    torch.manual_seed(0)
    m = timm.create_model(name, pretrained=False, img_size=64, depth=2, num_classes=10, **kw).eval()
    with torch.no_grad():
        for n, p in m.named_parameters():
            if 'gamma' in n: p.fill_(1.)
    return m


@pytest.fixture(scope='module')
def x64():
    return torch.randn(3, 3, 64, 64, generator=torch.Generator().manual_seed(1))


def _sens(model, x):
    return {a: permutation_sensitivity(model, x, grid_permutation(4, a, p)) for a, p in (('row', ROWS_4), ('col', COLS_4))}


def test_position_labels_brute_force():
    h, w = 3, 5
    for target in POSITION_TARGETS:
        want = [dict(position=r * w + c, row=r, col=c)[target] for r in range(h) for c in range(w)]
        assert position_labels((h, w), target).tolist() == want


def test_split_images_disjoint_and_seeded():
    tr, te = split_images(50, .2, seed=3)
    assert len(te) == 10 and len(tr) == 40 and not set(tr.tolist()) & set(te.tolist())
    assert torch.equal(te, split_images(50, .2, seed=3)[1]) and not torch.equal(te, split_images(50, .2, seed=4)[1])
    with pytest.raises(ValueError, match='at least 2'): split_images(1)
    with pytest.raises(ValueError, match='test_frac'): split_images(10, 1.)


def test_probe_deterministic_and_discriminating():
    g = torch.Generator().manual_seed(0)
    grid = (3, 4)
    code = 3 * torch.randn(12, 16, generator=g)                        # an arbitrary per-position code
    feats = torch.randn(120, 12, 16, generator=g) + code
    a = fit_position_probes(feats, grid, seed=0).table
    b = fit_position_probes(feats, grid, seed=0).table
    assert a.equals(b)                                                 # same seed -> same split, same probe
    assert (a.test_acc > 2 * a.chance).all()
    shuffled = torch.stack([f[torch.randperm(12, generator=g)] for f in feats])  # code moved to random slots per image
    c = fit_position_probes(shuffled, grid, seed=0).table
    assert (c.test_acc < 1.6 * c.chance).all()


def test_retention_formula():
    o, f, b = np.array([.2, .5, .9]), np.array([.1, .2, .3]), np.array([.9, .6, .3 + 1e-3])
    np.testing.assert_allclose(retention(o, f, b), [(o[i] - f[i]) / (b[i] - f[i]) for i in range(3)])
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter('always')
        r = retention([.4, .5], [.1, .2], [.7, .2])
    assert np.isnan(r[1]) and r[0] == pytest.approx(.5) and any('undefined' in str(x.message) for x in w)


def test_layer_tokens_matches_recorder():
    torch.manual_seed(0)
    m = timm.create_model('pe_vit_nano_patch1_8', pe='ape', num_classes=10).eval()
    x = torch.randn(6, 3, 8, 8)
    with torch.no_grad(), TokenRecorder(m, 'resid', layers=[2]) as rec:
        m(x)
        want = rec.patch_tokens('resid')[0]
    got = layer_tokens(m, [x[:4], x[4:]], layer=2, point='resid')
    assert torch.equal(got, want)
    assert torch.equal(layer_tokens(m, [x], layer=-1), layer_tokens(m, [x], layer=3))


def test_timm_rope_axes_and_knockouts(x64):
    m = _timm('vit_small_patch16_rope_224')
    ax = rotary_axes(m)
    assert ax.shape == (2, 6, 32)
    assert all((ax[b, h] == 'row').sum() == 16 and (ax[b, h] == 'col').sum() == 16 for b in range(2) for h in range(6))
    intact = _sens(m, x64)
    assert min(intact.values()) > 1e-3
    for axis, other in (('row', 'col'), ('col', 'row')):
        with rope_knockout(m, axis):
            s = _sens(m, x64)
        assert s[axis] < 1e-5 < 1e-3 < s[other], (axis, s)
    with rope_knockout(m):
        assert max(_sens(m, x64).values()) < 1e-5
    with rope_knockout(m, blocks=[1]):                                # block 0 still rotates
        assert min(_sens(m, x64).values()) > 1e-3
    with rope_knockout(m, heads=[0, 1, 2]):                           # the other heads still rotate
        assert min(_sens(m, x64).values()) > 1e-3
    with rope_knockout(m, heads=[0, 1, 2]), rope_knockout(m, heads=[3, 4, 5]):   # nested: every head
        assert max(_sens(m, x64).values()) < 1e-5
    assert _sens(m, x64) == intact                                    # hooks removed on exit


def test_eva02_position_removed_needs_both(x64):
    m = _timm('eva02_tiny_patch14_224', patch_size=16)
    assert m.pos_embed is not None and m.rope is not None
    with rope_knockout(m):                                            # the absolute PE still anchors position
        assert min(_sens(m, x64).values()) > 1e-3
    with position_removed(m):
        assert max(_sens(m, x64).values()) < 1e-5
    assert min(_sens(m, x64).values()) > 1e-3


def test_timm_rope_mixed():
    m = _timm('vit_small_patch16_rope_mixed_224')
    ax = rotary_axes(m)
    assert (ax == 'mixed').mean() > .9
    with pytest.raises(ValueError, match="axis='all'"): knockout_mask(m, 'row')
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(2))
    with rope_knockout(m):
        assert max(_sens(m, x).values()) < 1e-5


def test_timm_ape_floor_and_errors(x64):
    torch.manual_seed(0)
    m = timm.create_model('vit_small_patch16_224', pretrained=False, img_size=64, depth=2, num_classes=10).eval()
    with torch.no_grad(): m.pos_embed.normal_(0, 1)
    before = m.pos_embed.detach().clone()
    assert min(_sens(m, x64).values()) > 1e-3
    with position_removed(m):
        assert max(_sens(m, x64).values()) < 1e-5
    assert torch.equal(m.pos_embed, before)
    with pytest.raises(ValueError, match='no rotary position embedding'): rotary_axes(m)


def test_pevit_knockout_grid_of_blocks_and_heads():
    torch.manual_seed(0)
    m = timm.create_model('pe_vit_nano_patch1_8', pe='rope', num_classes=10)
    mask = knockout_mask(m, 'col', blocks=[1, 3], heads=[0])
    col = set(np.flatnonzero(rotary_axes(m)[0, 0] == 'col').tolist())   # the planes the knockout code reads as columns
    assert col == set(range(m.pos_embed.head_dim // 4))               # axial RoPE: planes 0..n-1 turn with x theta_k
    for b, h, p in itertools.product(range(4), range(m.num_heads), range(mask.shape[-1])):
        assert mask[b, h, p] == (0. if (b in (1, 3) and h == 0 and p in col) else 1.)
    with pytest.raises(IndexError, match='head 9'): knockout_mask(m, heads=[9])


def test_withheld_retention_ends():
    torch.manual_seed(0)
    m = timm.create_model('pe_vit_nano_patch1_8', pe='rope', num_classes=10).eval()
    imgs = [torch.randn(8, 3, 8, 8, generator=torch.Generator().manual_seed(i)) for i in range(2)]
    df = withheld_retention(m, imgs, ks=[0, 2, 4], n_perms=2, show_progress=False)
    assert df.withheld.tolist() == [0, 2, 4]
    np.testing.assert_allclose(df.retention.iloc[[0, 2]], [1., 0.], atol=1e-12)
    with pytest.raises(ValueError, match='k must be in'): withheld_retention(m, imgs, ks=[5])


def test_probe_knockouts_refit_matches_manual_fit():
    from pe_anchors.mech.position import probe_knockouts
    torch.manual_seed(0)
    m = timm.create_model('pe_vit_nano_patch1_8', pe='rope', num_classes=10).eval()
    with torch.no_grad():
        for p in m.parameters(): p.mul_(3)
    imgs = [torch.randn(16, 3, 8, 8, generator=torch.Generator().manual_seed(i)) for i in range(2)]
    df = probe_knockouts(m, imgs, layer=2, axes=('row',), targets=('row', 'col'), refit=True, steps=100)
    assert sorted(set(df.knockout)) == ['none', 'row'] and df.refit.all() and (df.layer == 2).all()
    with rope_knockout(m, 'row'):
        f = layer_tokens(m, imgs, 2)
    want = fit_position_probes(f, 8, ('row', 'col'), steps=100).table.set_index('target').test_acc
    got = df[df.knockout == 'row'].set_index('target').test_acc
    assert got.to_dict() == want.to_dict()
    base = fit_position_probes(layer_tokens(m, imgs, 2), 8, ('row', 'col'), steps=100).table.set_index('target').test_acc
    assert df[df.knockout == 'none'].set_index('target').test_acc.to_dict() == base.to_dict()


def test_rebuild_scan_on_timm_eva():
    from pe_anchors.mech.position import rebuild_heads
    m = _timm('vit_small_patch16_rope_224')
    imgs = [torch.randn(4, 3, 64, 64, generator=torch.Generator().manual_seed(i)) for i in range(2)]
    df = rebuild_heads(m, imgs, withheld=1, n_perms=1, show_progress=False)
    assert len(df) == 6 and set(df.block) == {1} and sorted(df['head']) == list(range(6))
    assert (df.ssdc_lost.diff().dropna() <= 0).all()
    np.testing.assert_allclose(df.ssdc_lost, df.ssdc_withheld - df.ssdc)
    wr = withheld_retention(m, imgs, n_perms=1, show_progress=False)
    np.testing.assert_allclose(wr.retention.iloc[[0, -1]], [1., 0.], atol=1e-12)
    assert wr.ssdc.iloc[1] == pytest.approx(df.ssdc_withheld.iloc[0])   # k = 1 withheld: the scan's reference


def test_nested_timm_knockouts_read_the_models_own_tables(x64):
    "An inner knockout classifies planes from the model's tables, not from those an outer knockout already rewrote."
    m = _timm('vit_small_patch16_rope_224')
    with rope_knockout(m, 'row'):
        np.testing.assert_array_equal(rotary_axes(m), rotary_axes(_timm('vit_small_patch16_rope_224')))
        with rope_knockout(m, 'row', blocks=[1]), rope_knockout(m, 'col'):
            assert max(_sens(m, x64).values()) < 1e-5
        assert _sens(m, x64)['row'] < 1e-5 < 1e-3 < _sens(m, x64)['col']
