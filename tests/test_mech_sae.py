"TopK SAE: codes, AuxK, selectivity against brute-force loops, and the splice / ablation hook on PEViT and timm models."
import numpy as np
import pytest
import timm
import torch

import pe_anchors  # noqa: F401  (registers the pe_vit_* models)
from pe_anchors.mech.position import fit_position_probes, layer_tokens
from pe_anchors.mech.sae import (TopKSAE, _aux_loss, fit_sae, latent_position_means, position_selectivity,
                                 positional_latents, sae_ablation, sae_causal_test, sae_stats)


def test_encode_keeps_the_k_largest_preactivations():
    torch.manual_seed(0)
    sae = TopKSAE(8, expansion=4, k=3).init_from_data(torch.randn(100, 8))
    x = torch.randn(20, 8)
    pre, z = sae.pre_acts(x), sae.encode(x)
    for i in range(20):                                               # brute force, token by token
        top = sorted(range(32), key=lambda j: -pre[i, j].item())[:3]
        want = torch.zeros(32)
        for j in top: want[j] = max(pre[i, j].item(), 0.)
        torch.testing.assert_close(z[i], want)
    xs = x * sae.scale
    torch.testing.assert_close(sae.decode(z), (z @ sae.W_dec + sae.b_pre) / sae.scale)
    torch.testing.assert_close(pre, (xs - sae.b_pre) @ sae.W_enc + sae.b_enc)


def test_aux_loss_uses_only_dead_latents():
    torch.manual_seed(0)
    sae = TopKSAE(8, expansion=4, k=3)
    pre, err = torch.randn(5, 32), torch.randn(5, 8)
    assert _aux_loss(sae, pre, err, torch.zeros(32, dtype=torch.bool), 4) == 0
    dead = torch.zeros(32, dtype=torch.bool); dead[[3, 7, 11]] = True
    za = torch.zeros(5, 32)
    for i in range(5):                                                # top min(k_aux, n_dead) = 2 of the 3 dead
        top = sorted([3, 7, 11], key=lambda j: -pre[i, j].item())[:2]
        for j in top: za[i, j] = max(pre[i, j].item(), 0.)
    want = (err - za @ sae.W_dec).square().sum(-1).mean()
    torch.testing.assert_close(_aux_loss(sae, pre, err, dead, 2), want)
    # the follow-up study's reduction: the mean over the d = 8 dimensions instead of the sum
    torch.testing.assert_close(_aux_loss(sae, pre, err, dead, 2, 'mean'), (err - za @ sae.W_dec).square().mean(-1).mean())
    with pytest.raises(ValueError, match='AuxK reduction'): fit_sae(torch.randn(10, 8), steps=1, aux_reduction='max')


def test_auxk_revives_dead_latents():
    "Half the latents start 100x too weak to reach the top k and never fire; AuxK brings them back, plain TopK cannot."
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8000, 8, generator=g).abs() + .1                  # positive data
    alive = {}
    for coef in (0., 1 / 32):
        sae = TopKSAE(8, 4, 2).init_from_data(x)
        with torch.no_grad(): sae.W_enc[:, 16:] *= .01
        assert sae_stats(sae, x)['dead_frac'] >= .5
        sae, _ = fit_sae(x, k_aux=16, aux_coef=coef, steps=300, bs=512, lr=3e-3, dead_after=2000, sae=sae,
                         show_progress=False)
        alive[coef] = 1 - sae_stats(sae, x)['dead_frac']
    assert alive[1 / 32] > alive[0.] + .1, alive


def test_selectivity_against_loops():
    torch.manual_seed(0)
    h, w, n = 3, 4, 6
    means = torch.rand(h * w, n)
    means[:, 5] = 0                                                   # a silent latent
    t = position_selectivity(means, (h, w))
    for f in range(n - 1):
        m = means[:, f].double()
        overall = m.mean().item()
        rows = [m[r * w:(r + 1) * w].mean().item() for r in range(h)]
        cols = [m[[r * w + c for r in range(h)]].mean().item() for c in range(w)]
        pos = [m[p].item() - (m.sum().item() - m[p].item()) / (h * w - 1) for p in range(h * w)]
        assert t.row_sel[f] == pytest.approx(max(rows) / overall) and t.best_row[f] == int(np.argmax(rows))
        assert t.col_sel[f] == pytest.approx(max(cols) / overall) and t.best_col[f] == int(np.argmax(cols))
        assert t.pos_sel[f] == pytest.approx(max(pos)) and t.best_pos[f] == int(np.argmax(pos))
    assert np.isnan(t.row_sel[5])
    with pytest.raises(ValueError, match='grid has 12'): position_selectivity(means[:10], (h, w))


def test_nearly_dead_latents_are_not_ranked():
    "A latent firing once, in one row, has the largest row ratio (H) over a near-zero denominator: it must not come first."
    torch.manual_seed(0)
    h, w, n = 4, 4, 10
    means = torch.rand(h * w, n) + .1                                 # live latents, none concentrated in one row
    means[:w, 0] += 2.                                                # latent 0: a genuine first-row feature
    means[:, 9] = 0; means[5, 9] = 1e-7                               # latent 9: fired once, at (1, 1)
    raw = position_selectivity(means, (h, w), min_rel_act=0)
    assert raw.row_sel[9] == pytest.approx(h) and raw.row_sel.idxmax() == 9      # the bare ratio ranks it first
    t = position_selectivity(means, (h, w))
    avg = means.double().mean(0).mean().item()
    for f in range(n):                                                # the floor, written out: 1 % of the average latent
        assert np.isnan(t.row_sel[f]) == (means[:, f].double().mean().item() < .01 * avg)
    assert np.isnan(t.row_sel[9]) and np.isnan(t.col_sel[9]) and np.isnan(t.pos_sel[9])
    assert positional_latents(t, 'row', threshold=1.)[0] == 0 and 9 not in positional_latents(t, 'row', threshold=1.)
    assert t.nlargest(1, 'row_sel').latent.item() == 0 and t.nlargest(n - 1, 'pos_sel').latent.tolist().count(9) == 0
    with pytest.raises(ValueError, match='min_rel_act'): position_selectivity(means, (h, w), min_rel_act=1.5)


def test_latent_position_means_is_a_mean_over_images():
    torch.manual_seed(0)
    sae = TopKSAE(8, 2, 3).init_from_data(torch.randn(50, 8))
    f = torch.randn(7, 5, 8)
    want = torch.stack([sae.encode(f[i]) for i in range(7)]).mean(0)
    torch.testing.assert_close(latent_position_means(sae, f, bs=3), want)


@pytest.mark.parametrize('name', ['pe_vit_nano_patch1_8', 'vit_small_patch16_rope_224'])
def test_splice_is_exact_and_ablation_acts(name):
    torch.manual_seed(0)
    kw = dict(pe='ape') if name.startswith('pe_') else dict(img_size=32, depth=2)
    m = timm.create_model(name, num_classes=10, **kw).eval()
    with torch.no_grad():                                             # Eva's layer scale starts at 1e-5: make blocks count
        for n, p in m.named_parameters():
            if 'gamma' in n: p.fill_(1.)
    s = m.patch_embed.img_size[0]
    imgs = [torch.randn(8, 3, s, s, generator=torch.Generator().manual_seed(i)) for i in range(2)]
    toks = layer_tokens(m, imgs, 1, 'resid')
    sae, _ = fit_sae(toks, expansion=2, k=4, steps=30, bs=256, show_progress=False)
    with torch.no_grad():
        ref = m(imgs[0])
        with sae_ablation(m, sae, 1, []): same = m(imgs[0])
        busy = latent_position_means(sae, toks).mean(0).argsort(descending=True)[:3]
        with sae_ablation(m, sae, 1, busy): zero = m(imgs[0])
        with sae_ablation(m, sae, 1, busy, 'mean', latent_position_means(sae, toks).mean(0)): mean = m(imgs[0])
        after = m(imgs[0])
    scale = ref.abs().max()
    assert (same - ref).abs().max() / scale < 1e-4
    assert (zero - ref).abs().max() / scale > 1e-3 and (mean - ref).abs().max() / scale > 1e-3
    assert torch.equal(after, ref)                                   # hook removed


def test_causal_test_matches_its_parts():
    "Each row equals the probes / SSDC / top-1 measured by hand with the same ablation in place."
    from pe_anchors.interventions import measure_ssdc
    torch.manual_seed(0)
    m = timm.create_model('pe_vit_nano_patch1_8', pe='ape', num_classes=10).eval()
    with torch.no_grad(): m.pos_embed.pos_embed.mul_(50)
    data = [(torch.randn(24, 3, 8, 8, generator=torch.Generator().manual_seed(i)), torch.randint(0, 10, (24,)))
            for i in range(3)]
    toks = layer_tokens(m, data, 1, 'resid')
    sae, _ = fit_sae(toks, expansion=4, k=8, steps=200, bs=512, lr=3e-3, show_progress=False)
    probes = fit_position_probes(layer_tokens(m, data, 2), 8, steps=200)
    sel = position_selectivity(latent_position_means(sae, toks), 8)
    lat = sel.nlargest(8, 'pos_sel').latent.to_numpy()
    df = sae_causal_test(m, sae, data, block=1, latents=lat, probes=probes, layer=2, n_random=2, n_perms=1, seed=3,
                         show_progress=False, match='count')
    assert df.ablation.tolist() == ['intact', 'selected', 'random 0', 'random 1']
    assert df.kind.tolist() == ['intact', 'selected', 'random', 'random']
    assert df.n_latents.tolist() == [0, 8, 8, 8]
    means = latent_position_means(sae, toks).mean(0)
    floor = .01 * means.mean().item()                                 # random sets: latents above the activation floor
    alive = set(np.flatnonzero((means.numpy() > 0) & (means.numpy() >= floor)).tolist()) - set(lat.tolist())
    rng = np.random.default_rng(3)
    sets = [[], lat] + [rng.choice(sorted(alive), 8, replace=False) for _ in range(2)]
    for row, s in zip(df.itertuples(), sets):
        with sae_ablation(m, sae, 1, s, 'zero', means):
            acc = probes.score(layer_tokens(m, data, 2)).set_index('target').test_acc
            ssdc = measure_ssdc(m, data, 'rpi', 1, layers=[2]).values.mean()
            with torch.no_grad():
                top1 = np.mean(np.concatenate([(m(x).argmax(-1) == y).numpy() for x, y in data]))
        assert (row.probe_position, row.probe_row, row.probe_col) == (acc['position'], acc['row'], acc['col'])
        assert row.ssdc == pytest.approx(ssdc, abs=1e-12) and row.top1 == pytest.approx(top1)
    assert df.probe_position[1] < df.probe_position[0]               # the selected latents carry position
    with pytest.raises(ValueError, match='no latents selected'):
        sae_causal_test(m, sae, data, block=1, latents=[], probes=probes, layer=2)
    with pytest.raises(ValueError, match='at or after'):
        sae_causal_test(m, sae, data, block=2, latents=lat, layer=1)


def test_controls_matched_on_the_norm_removed():
    "Random control sets remove about as much of each token as the selected set; `removed_norm` is the hook's own change."
    from pe_anchors.mech.sae import removed_norm
    torch.manual_seed(0)
    m = timm.create_model('pe_vit_nano_patch1_8', pe='ape', num_classes=10).eval()
    with torch.no_grad(): m.pos_embed.pos_embed.mul_(50)
    data = [(torch.randn(24, 3, 8, 8, generator=torch.Generator().manual_seed(i)), torch.randint(0, 10, (24,)))
            for i in range(3)]
    toks = layer_tokens(m, data, 1, 'resid')
    sae, _ = fit_sae(toks, expansion=4, k=8, steps=200, bs=512, lr=3e-3, show_progress=False)
    sel = position_selectivity(latent_position_means(sae, toks), 8)
    lat = sel.nlargest(8, 'pos_sel').latent.to_numpy()
    # the norm removed, by hand: the tokens entering block 1 with and without the ablation
    from pe_anchors.hooks import TokenRecorder
    def entering(ablate):                                             # the recorder's hook after the ablation's
        with sae_ablation(m, sae, 1, lat if ablate else []), TokenRecorder(m, 'resid', layers=[1]) as rec, torch.no_grad():
            return torch.cat([(m(x), rec.patch_tokens('resid')[0])[1] for x, _ in data])
    base, abl = entering(False), entering(True)
    assert removed_norm(sae, toks, lat) == pytest.approx((abl - base).norm(dim=-1).mean().item(), rel=1e-4)
    df = sae_causal_test(m, sae, data, block=1, latents=lat, n_random=3, n_perms=1, seed=3, show_progress=False, tol=.25)
    target = df.loc[df.ablation == 'selected', 'norm_removed'].item()
    rand = df.loc[df.kind == 'random', 'norm_removed']
    assert len(rand) == 3 and (abs(rand - target) <= .25 * target).all()
    with pytest.raises(ValueError, match='within'):
        sae_causal_test(m, sae, data, block=1, latents=lat, n_random=3, n_perms=1, show_progress=False, tol=1e-9, tries=5)


def test_mass_that_no_random_set_reaches_is_named():
    "When every other active latent together removes less than the selected set, 'mass' refuses at once with both norms."
    from pe_anchors.mech.sae import MassUnmatched, removed_norm
    torch.manual_seed(0)
    m = timm.create_model('pe_vit_nano_patch1_8', pe='ape', num_classes=10).eval()
    with torch.no_grad(): m.pos_embed.pos_embed.mul_(50)
    data = [(torch.randn(24, 3, 8, 8, generator=torch.Generator().manual_seed(i)), torch.randint(0, 10, (24,)))
            for i in range(2)]
    toks = layer_tokens(m, data, 1, 'resid')
    sae, _ = fit_sae(toks, expansion=4, k=8, steps=200, bs=512, lr=3e-3, show_progress=False)
    means = latent_position_means(sae, toks).mean(0).cpu().numpy()
    order = np.argsort(-means)
    alive = order[means[order] > 0]
    lat, rest = alive[:100], alive[100:]                                 # the heaviest latents against all the others
    target, ceiling = removed_norm(sae, toks, lat), removed_norm(sae, toks, rest)   # by hand, every other latent at once
    assert ceiling < .8 * target
    with pytest.raises(MassUnmatched) as e:
        sae_causal_test(m, sae, data, block=1, latents=lat, n_random=2, n_perms=1, show_progress=False, min_rel_act=0)
    assert e.value.target == pytest.approx(target, rel=1e-4) and e.value.ceiling == pytest.approx(ceiling, rel=1e-3)
    df = sae_causal_test(m, sae, data, block=1, latents=lat, n_random=2, n_perms=1, show_progress=False, min_rel_act=0,
                         match='count')
    assert (df.loc[df.kind == 'random', 'n_latents'] == len(lat)).all()
