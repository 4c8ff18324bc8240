"""Interventions (pe_anchors.interventions): RPI averaging, exact hook properties, ΔSSDC, α sweeps, tables, plots."""
import math

import numpy as np
import pandas as pd
import pytest
import timm
import torch
import torch.nn.functional as F

from pe_anchors.results import RESULT_COLUMNS
from pe_anchors.pos_embed import sincos_2d
from pe_anchors.core import image_perms
from pe_anchors.vit import PEViT
from pe_anchors.hooks import TokenRecorder, TokenPermutation
from pe_anchors.ssdc import ssdc_curve, ssdc_from_similarity
from pe_anchors.interventions import (SSDC_MODES, SSDCRuns, spread, measure_ssdc, delta_ssdc, ssdc_trajectories,
                                      pe_scaled, alpha_sweep)
from pe_anchors.plots import plot_ssdc
from pe_anchors.paper import paper_curves, PAPER_SSDC


def smooth_images(n, size=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return F.interpolate(torch.randn(n, 3, 4, 4, generator=g), size=size, mode='bilinear', align_corners=False)


def vit(pe, seed=0, **kw):
    torch.manual_seed(seed)
    return PEViT(img_size=16, patch_size=2, embed_dim=32, depth=3, num_heads=2, num_classes=4, pe=pe, **kw)  # 8x8


@pytest.fixture(scope='module')
def batches():
    x = smooth_images(32)
    return [x[:16], x[16:]]


def test_spread_written_out():
    d = np.array([[1., 10.], [2., 10.], [4., 10.]])
    s = spread(d)
    sd = math.sqrt(((1 - 7 / 3) ** 2 + (2 - 7 / 3) ** 2 + (4 - 7 / 3) ** 2) / 2)
    half = 4.302652729911275 * sd / math.sqrt(3)                              # t_{.975, 2}
    np.testing.assert_allclose(s['value'], [7 / 3, 10.]); np.testing.assert_allclose(s['sd'], [sd, 0.])
    np.testing.assert_allclose(s['ci_low'][0], 7 / 3 - half); np.testing.assert_allclose(s['ci_high'][0], 7 / 3 + half)
    assert s['min'][0] == 1 and s['max'][0] == 4
    assert np.isnan(spread(d[:1])['sd']).all()


def test_nope_under_rpi_averages_to_zero(batches):
    # Untrained NoPE: strong static prior unpermuted. Under RPI the expected SSDC is 0; each draw is a chance value.
    # Tolerance: the mean of K independent draws has standard error sd/sqrt(K); we require |mean| < 4 SE at every
    # layer (a false failure has probability ~6e-5 per layer under the null; the run is seeded, hence deterministic)
    # and also |mean| < .03, well below the structure RPI is meant to detect (paper: APE/SPE >= .23 after block 0).
    m = vit('none')
    normal = measure_ssdc(m, batches)
    assert (normal.values > .3).all()
    for mode in ('rpi', 'rpi_image'):
        runs = measure_ssdc(m, batches, mode, n_perms=16, perm_seed=1)
        s = runs.summary()
        se = s['sd'] / math.sqrt(16)
        assert runs.values.shape == (16, 3) and runs.n_perms == 16
        assert (np.abs(s['value']) < 4 * se).all() and (np.abs(s['value']) < .03).all(), (mode, s['value'], se)
        assert (s['sd'] > 0).all()                                            # individual draws do vary


def test_rpi_draws_are_seeded_and_distinct(batches):
    m = vit('ape')
    a = measure_ssdc(m, batches, 'rpi', n_perms=3, perm_seed=7)
    b = measure_ssdc(m, batches, 'rpi', n_perms=3, perm_seed=7)
    np.testing.assert_array_equal(a.values, b.values)
    assert len(np.unique(a.values[:, 0])) == 3


@pytest.mark.parametrize('pe', ['none', 'ape', 'spe', 'rope'])
def test_identity_permutation_leaves_ssdc_unchanged(pe, batches):
    m = vit(pe)
    with TokenPermutation(m, perm=torch.arange(64)): ident = ssdc_curve(m, batches).compute()
    torch.testing.assert_close(ident, ssdc_curve(m, batches).compute(), rtol=0, atol=0)


def test_nope_rpi_is_relabelled_matrix_on_fixed_grid(batches):
    # NoPE is permutation-equivariant: RPI with a fixed pi gives S[pi][:, pi]; D stays on the slot grid
    m = vit('none')
    pi = torch.randperm(64, generator=torch.Generator().manual_seed(3))
    with TokenPermutation(m, perm=pi): rpi = ssdc_curve(m, batches)
    S = ssdc_curve(m, batches).mean_similarity()
    torch.testing.assert_close(rpi.mean_similarity(), S[:, pi][:, :, pi], rtol=0, atol=1e-5)
    np.testing.assert_allclose(rpi.compute().numpy(), ssdc_from_similarity(S[:, pi][:, :, pi], 8).numpy(), atol=1e-6)
    assert not np.allclose(rpi.compute().numpy(), ssdc_curve(m, batches).compute().numpy(), atol=.1)


def anchored_ape(scale=.15, gain=8., tau=1.5, amp=6.):
    "Hand-built APE whose first block amplifies a weak smooth PE above a threshold (see nbs/07_interventions)."
    m = vit('ape')
    h = 16
    with torch.no_grad():
        m.patch_embed.proj.weight[h:] = 0; m.patch_embed.proj.bias[h:] = 0
        m.pos_embed.pos_embed.zero_(); m.pos_embed.pos_embed[0, 1:, h:] = scale * sincos_2d(8, h)
        b = m.blocks[0]
        b.attn.proj.weight.zero_(); b.attn.proj.bias.zero_()
        b.mlp.fc1.weight.zero_(); b.mlp.fc1.bias.fill_(-1e4); b.mlp.fc2.weight.zero_(); b.mlp.fc2.bias.zero_()
        eye = torch.eye(h)
        b.mlp.fc1.weight[:h, h:], b.mlp.fc1.weight[h:2 * h, h:] = gain * eye, -gain * eye
        b.mlp.fc1.bias[:2 * h] = -tau
        b.mlp.fc2.weight[h:, :h], b.mlp.fc2.weight[h:, h:2 * h] = amp * eye, -amp * eye
    return m.eval()


def test_alpha_zero_ape_equals_nope_twin(batches):
    ape = vit('ape')
    with torch.no_grad(): ape.pos_embed.pos_embed.mul_(50)                   # a PE that matters
    twin = vit('none', seed=1)
    twin.load_state_dict({k: v for k, v in ape.state_dict().items() if not k.startswith('pos_embed.')})
    assert not np.allclose(measure_ssdc(ape, batches).values, measure_ssdc(twin, batches).values, atol=1e-3)
    with pe_scaled(ape, 0.):
        for mode in ('normal', 'rpi'):
            np.testing.assert_array_equal(measure_ssdc(ape, batches, mode, 3).values,
                                          measure_ssdc(twin, batches, mode, 3).values)
        d_ape = delta_ssdc(ape, batches, n_perms=4)
    assert d_ape == delta_ssdc(twin, batches, n_perms=4)
    sweep = alpha_sweep(ape, batches, alphas=(0.,), n_perms=4)
    assert sweep.value.item() == d_ape['value']
    assert ape.pos_embed.alpha == 1.0


def test_anchored_ape_keeps_structure_under_rpi_and_collapses_with_alpha(batches):
    m = anchored_ape()
    runs = measure_ssdc(m, batches, 'rpi', n_perms=4)
    assert runs.values[:, 0].mean() < .1 and (runs.values[:, 1:] > .3).all()   # weak at block 0, amplified after
    sweep = alpha_sweep(m, batches, alphas=(1., .6, .2, 0.), n_perms=4,
                        metrics={'alpha_seen': lambda mm: mm.pos_embed.alpha}, condition='ape', dataset='toy')
    d = sweep[sweep.metric == 'delta_ssdc'].set_index('alpha')['value']
    assert d[1.] > .3 and d[.6] > .3 and d[.2] < d[.6] / 2 and abs(d[0.]) < .05   # a plateau, then the collapse
    seen = sweep[sweep.metric == 'alpha_seen']
    np.testing.assert_array_equal(seen.value, seen.alpha)                    # metrics are called with alpha applied
    assert (seen['mode'] == 'normal').all() and (sweep[sweep.metric == 'delta_ssdc']['mode'] == 'rpi').all()
    assert list(sweep.columns[:len(RESULT_COLUMNS)]) == list(RESULT_COLUMNS)
    assert (sweep.condition == 'ape').all() and (sweep.dataset == 'toy').all()


def test_delta_is_layer1_minus_layer0(batches):
    m = anchored_ape()
    runs = measure_ssdc(m, batches, 'rpi', n_perms=3, perm_seed=2)
    d = delta_ssdc(m, batches, n_perms=3, perm_seed=2)
    np.testing.assert_allclose(d['value'], (runs.values[:, 1] - runs.values[:, 0]).mean(), atol=1e-12)
    np.testing.assert_allclose(d['sd'], (runs.values[:, 1] - runs.values[:, 0]).std(ddof=1), atol=1e-12)
    assert d['n_perms'] == 3 and d['n_images'] == 32
    with pytest.raises(ValueError, match='layer 2 was not measured'): measure_ssdc(m, batches, layers=[0, 1]).delta(2)


def test_trajectories_table(batches):
    m = vit('rope')
    df = ssdc_trajectories(m, batches, modes=('normal', 'rpi', 'rpi_image'), n_perms=3, per_image=True,
                           condition='rope', seed=2, dataset='toy')
    assert list(df.columns[:len(RESULT_COLUMNS)]) == list(RESULT_COLUMNS)
    assert {'sd', 'min', 'max', 'n_perms', 'n_images', 'perm_seed'} <= set(df.columns)
    for mode, metrics in (('normal', ('ssdc', 'ssdc_image')), ('rpi', ('ssdc', 'ssdc_image')), ('rpi_image', ('ssdc_image',))):
        for metric in metrics:
            assert sorted(df[(df['mode'] == mode) & (df.metric == metric)].layer) == [0, 1, 2]
    assert df[(df['mode'] == 'rpi_image') & (df.metric == 'ssdc')].empty      # never pooled across permutations
    deltas = df[df.metric == 'delta_ssdc']
    assert sorted(deltas['mode']) == ['rpi', 'rpi_image'] and (deltas.layer == -1).all()
    normal = df[(df['mode'] == 'normal') & (df.metric == 'ssdc')]
    assert normal.n_perms.eq(0).all() and normal.ci_low.isna().all()
    img = df[(df['mode'] == 'normal') & (df.metric == 'ssdc_image')]
    assert ((img.ci_low <= img.value) & (img.value <= img.ci_high)).all()
    assert (df.seed == 2).all() and (df.condition == 'rope').all()


def test_pe_scaled_peVit_and_timm():
    m = vit('rope')
    with pe_scaled(m, .3): assert m.pos_embed.alpha == .3
    assert m.pos_embed.alpha == 1.
    t = timm.create_model('vit_tiny_patch16_224', pretrained=False, img_size=16, patch_size=4, embed_dim=16, depth=1,
                          num_heads=2, num_classes=2)
    before = t.pos_embed.detach().clone()
    with pe_scaled(t, .25): torch.testing.assert_close(t.pos_embed.detach(), .25 * before)
    torch.testing.assert_close(t.pos_embed.detach(), before, rtol=0, atol=0)
    with pytest.raises(RuntimeError, match='boom'):
        with pe_scaled(t, 0.): raise RuntimeError('boom')
    torch.testing.assert_close(t.pos_embed.detach(), before, rtol=0, atol=0)   # restored on error too
    with pytest.raises(ValueError, match='alpha must be'):
        with pe_scaled(t, float('nan')): pass
    with pytest.raises(ValueError, match='alpha must be'):
        with pe_scaled(m, -1.): pass


def test_timm_vit_under_rpi_and_alpha_sweep():
    t = timm.create_model('vit_tiny_patch16_224', pretrained=False, img_size=16, patch_size=2, embed_dim=32, depth=2,
                          num_heads=2, num_classes=2).eval()
    x = [smooth_images(16)]
    sweep = alpha_sweep(t, x, alphas=(1., 0.), n_perms=2)
    assert sweep.shape[0] == 2 and sweep.value.notna().all()


def test_bad_input(batches):
    m = vit('none')
    with pytest.raises(ValueError, match='one-shot iterator'): measure_ssdc(m, iter(batches), 'rpi', n_perms=2)
    measure_ssdc(m, iter(batches), 'rpi', n_perms=1)                         # one pass is fine
    with pytest.raises(ValueError, match="unknown SSDC mode 'perm'"): measure_ssdc(m, batches, 'perm')
    with pytest.raises(ValueError, match='n_perms must be >= 1'): measure_ssdc(m, batches, 'rpi', n_perms=0)
    with pytest.raises(ValueError, match='empty'): measure_ssdc(m, [], 'rpi', n_perms=2)
    no_pos = timm.create_model('vit_tiny_patch16_224', img_size=32, patch_size=4, depth=2, pos_embed='none')
    with pytest.raises(ValueError, match='no positional encoding to scale'):
        with pe_scaled(no_pos, .5): pass
    with pytest.raises(ValueError, match='is not a ViT'):
        with pe_scaled(torch.nn.Linear(2, 2), .5): pass
    dl = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(smooth_images(8)), batch_size=4, shuffle=True)
    with pytest.warns(UserWarning, match='shuffles'): measure_ssdc(m, dl, 'rpi', n_perms=2)


def test_plot_ssdc_paper_style(batches):
    import matplotlib
    matplotlib.use('Agg')
    rows = []
    for seed in (0, 1):
        for cond, pe in (('ape', 'ape'), ('nope', 'none')):
            rows.append(measure_ssdc(vit(pe, seed), batches).to_frame(condition=cond, seed=seed))
    df = pd.concat(rows)
    ax = plot_ssdc(df, references={'APE (paper)': PAPER_SSDC['normal']['ape'][:3]})
    assert ax.get_xlabel() == 'Layer'
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ['APE', 'NoPE', 'APE (paper)', '±1 SD over seeds']   # the bands (two seeds) are explained too
    ape_line = ax.get_lines()[0]
    expect = df[df.condition == 'ape'].groupby('layer').value.mean().values       # mean over the two seeds
    np.testing.assert_allclose(ape_line.get_ydata(), expect)
    band = ax.collections[0].get_paths()[0].vertices[:, 1]                        # ±1 SD over seeds
    sd = df[df.condition == 'ape'].groupby('layer').value.std().values
    assert np.isclose(band.max(), (expect + sd).max()) and np.isclose(band.min(), (expect - sd).min())
    assert ax.get_lines()[2].get_color() == ape_line.get_color()                # reference shares the APE colour
    with pytest.raises(ValueError, match="mode='rpi'"): plot_ssdc(df, mode='rpi')
    assert set(paper_curves('rpi')) == {'APE (paper)', 'RoPE (paper)', 'SPE (paper)'}
    assert all(len(v) == 12 for d in PAPER_SSDC.values() for v in d.values())
    import matplotlib.pyplot as plt; plt.close('all')


def test_measure_ssdc_at_another_tap_point(batches):
    "`point` reaches the recorder: SSDC of the blocks' outputs, by hand from TokenRecorder features, under a fixed RPI draw."
    from pe_anchors.hooks import TokenRecorder
    from pe_anchors.ssdc import ssdc as ssdc_of
    model = vit('spe').eval()
    runs = measure_ssdc(model, batches, 'rpi', n_perms=1, perm_seed=5, point='block', layers=[1, 2])
    feats = []
    with torch.no_grad(), TokenPermutation(model, mode='draw', seed=5), TokenRecorder(model, 'block', layers=[1, 2]) as rec:
        for x in batches:
            model(x); feats.append(rec.patch_tokens('block'))
    want = ssdc_of(torch.cat(feats, dim=1), 8).numpy()
    np.testing.assert_allclose(runs.values[0], want, atol=1e-5)                  # float32 sums in another order
    assert not np.allclose(runs.values[0], measure_ssdc(model, batches, 'rpi', 1, 5, layers=[1, 2]).values[0])


def _numpy_ssdc(tokens, grid=8):
    "Reference: numpy cosine matrices, scipy Spearman with minus the Manhattan distance (upper triangle)."
    from scipy.stats import spearmanr
    rc = np.stack(np.divmod(np.arange(grid * grid), grid), 1)
    neg_d = -np.abs(rc[:, None] - rc[None]).sum(-1)
    iu = np.triu_indices(grid * grid, 1)
    x = tokens / np.linalg.norm(tokens, axis=-1, keepdims=True)
    return lambda sims: spearmanr(sims[iu], neg_d[iu]).statistic, x


def test_rpi_is_batching_invariant():
    # Issue: a fresh permutation per batch, pooled, rises with the number of batches. A draw must be one permutation
    # shared by every batch, and per-image permutations must depend on the image's index only.
    x = smooth_images(48, seed=3)
    m = vit('spe')
    for mode in ('rpi', 'rpi_image'):
        vals = []
        for n in (1, 2, 4):
            parts = list(x.chunk(n))
            runs = measure_ssdc(m, parts, mode, n_perms=3, perm_seed=11, per_image=True)
            vals.append((runs.values, runs.image_values))
        for v, iv in vals[1:]:
            np.testing.assert_allclose(v, vals[0][0], atol=1e-6, rtol=0)
            np.testing.assert_allclose(iv, vals[0][1], atol=1e-6, rtol=0)
    # the estimator that was wrong: fresh permutations per batch, pooled, drift with the batching
    fresh = []
    for n in (1, 4):
        with TokenPermutation(m, mode='batch', seed=0): fresh.append(ssdc_curve(m, list(x.chunk(n)), layers=[0]).compute().item())
    assert abs(fresh[1] - fresh[0]) > 1e-3


def test_rpi_draw_against_a_written_out_reference():
    # One draw = torch.randperm(N) from a CPU generator seeded perm_seed + k, applied to every image of every batch;
    # SSDC of the image-averaged cosine matrix, computed here with numpy and scipy.
    x = smooth_images(20, seed=4)
    m = vit('ape').eval()
    runs = measure_ssdc(m, [x[:7], x[7:]], 'rpi', n_perms=2, perm_seed=5, layers=[0, 2])
    for k in range(2):
        perm = torch.randperm(64, generator=torch.Generator().manual_seed(5 + k))
        with torch.no_grad(), TokenPermutation(m, perm=perm), TokenRecorder(m, 'ln1', layers=[0, 2]) as rec: m(x)
        feats = rec.patch_tokens('ln1').double().numpy()                          # (2, 20, 64, C)
        for j in range(2):
            rho, xn = _numpy_ssdc(feats[j])
            S = np.einsum('bnc,bmc->nm', xn, xn) / len(xn)
            np.testing.assert_allclose(runs.values[k, j], rho(S), atol=2e-5)   # float32 model features vs float64


def test_rpi_image_against_a_written_out_reference():
    # Image i of draw k is permuted by image_perms(perm_seed + k, i); its own SSDC; the draw's value is their mean.
    x = smooth_images(10, seed=5)
    m = vit('rope').eval()
    runs = measure_ssdc(m, [x[:3], x[3:]], 'rpi_image', n_perms=2, perm_seed=9, layers=[1])
    for k in range(2):
        ref = []
        for i in range(len(x)):
            perm = torch.from_numpy(np.random.default_rng([9 + k, i]).permutation(64))
            test = image_perms(9 + k, i, 1, 64)[0]
            assert torch.equal(perm, test)
            with torch.no_grad(), TokenPermutation(m, perm=perm), TokenRecorder(m, 'ln1', layers=[1]) as rec: m(x[i:i + 1])
            rho, xn = _numpy_ssdc(rec.patch_tokens('ln1')[0, 0].double().numpy())
            ref.append(rho(xn @ xn.T))
        np.testing.assert_allclose(runs.image_values[k, 0], ref, atol=2e-5)
        np.testing.assert_allclose(runs.values[k, 0], np.mean(ref), atol=2e-5)
    assert runs.metric == 'ssdc_image'
