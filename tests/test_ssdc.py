"""SSDC engine (pe_anchors.ssdc): batched Spearman against scipy, closed-form SSDC toys, streaming, models, bad input."""
import math, warnings

import numpy as np
import pytest
import scipy.stats as ss
import timm
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st, HealthCheck
from hypothesis.extra.numpy import arrays

from pe_anchors.pos_embed import sincos_2d
from pe_anchors.vit import PEViT
from pe_anchors.hooks import TokenRecorder
from pe_anchors.ssdc import (DISTANCES, grid_distance, upper_pairs, average_ranks, spearman, token_similarity,
                             ssdc_from_similarity, ssdc, ssdc_per_image, SSDCAccumulator, ssdc_curve, bootstrap_ci)

HYP = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def scipy_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    "scipy.stats.spearmanr row by row (the independent reference)."
    a, b = np.broadcast_arrays(a, b)
    flat_a, flat_b = a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1])
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        out = [ss.spearmanr(x, y).statistic for x, y in zip(flat_a, flat_b)]
    return np.array(out, dtype=np.float64).reshape(a.shape[:-1])


def check_against_scipy(a: torch.Tensor, b: torch.Tensor):
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        got = spearman(a, b).numpy()
    ref = scipy_rows(a.double().numpy(), b.double().numpy())
    np.testing.assert_allclose(got, ref, atol=1e-6, rtol=0, equal_nan=True)


shapes = st.tuples(st.integers(1, 4), st.integers(2, 40))
finite = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False, width=32)


@HYP
@given(st.data())
def test_spearman_random_matches_scipy(data):
    r, n = data.draw(shapes)
    a = data.draw(arrays(np.float32, (r, n), elements=finite))
    b = data.draw(arrays(np.float64, (r, n), elements=st.floats(-1e3, 1e3)))
    check_against_scipy(torch.from_numpy(a), torch.from_numpy(b))             # float32 (packed-key sort) vs float64
    check_against_scipy(torch.from_numpy(a).double(), torch.from_numpy(b))    # float64 (torch.sort path)


@HYP
@given(st.data())
def test_spearman_tied_and_integer_matches_scipy(data):
    r, n = data.draw(shapes)
    levels = data.draw(st.integers(1, 5))                                     # 1 level = constant rows (NaN)
    a = data.draw(arrays(np.int64, (r, n), elements=st.integers(0, levels - 1)))
    b = data.draw(arrays(np.float32, (r, n), elements=st.sampled_from([-1.5, -0., 0., 2., 7.25])))
    check_against_scipy(torch.from_numpy(a), torch.from_numpy(b))             # integer dtype vs tied floats
    check_against_scipy(torch.from_numpy(a).float(), torch.from_numpy(b))     # integer-valued floats
    check_against_scipy(torch.from_numpy(b), torch.from_numpy(b[:1]).expand(r, n))


@HYP
@given(st.data())
def test_average_ranks_matches_rankdata(data):
    r, n = data.draw(shapes)
    x = data.draw(arrays(np.float32, (r, n), elements=st.sampled_from([0., 1., 1., 2.5, -3.]) | finite))
    np.testing.assert_array_equal(average_ranks(torch.from_numpy(x)).numpy(), ss.rankdata(x, axis=-1))
    np.testing.assert_array_equal(average_ranks(torch.from_numpy(x).double()).numpy(), ss.rankdata(x, axis=-1))


def test_spearman_broadcasts_and_shared_operand():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(3, 1, 30, generator=g), torch.randn(4, 30, generator=g)
    out = spearman(a, b)
    assert out.shape == (3, 4) and out.dtype == torch.float64
    np.testing.assert_allclose(out.numpy(), scipy_rows(a.double().numpy(), b.double().numpy()), atol=1e-12)
    np.testing.assert_allclose(spearman(b[0], a[:, 0]).numpy(), spearman(a[:, 0], b[0]).numpy(), atol=1e-15)
    assert spearman(torch.arange(5.), torch.arange(5.)).ndim == 0


def test_spearman_large_rows_match_scipy():
    # long rows go through the chunked path and the sparse tie correction (float32 values with forced ties)
    g = torch.Generator().manual_seed(1)
    a = torch.randn(70, 3000, generator=g)
    a[:, ::7] = a[:, :1]                                                      # a run of ~430 equal values per row
    b = torch.randint(0, 20, (3000,), generator=g).float()
    np.testing.assert_allclose(spearman(a, b).numpy(), scipy_rows(a.double().numpy(), b.double().numpy()[None]),
                               atol=1e-10)


def test_constant_input_is_nan_with_warning():
    with pytest.warns(ss.ConstantInputWarning):
        r = spearman(torch.stack([torch.full((6,), 2.), torch.arange(6.)]), torch.arange(6.))
    assert math.isnan(r[0]) and r[1] == 1
    with pytest.warns(ss.ConstantInputWarning):
        assert spearman(torch.arange(4.), torch.zeros(4)).isnan()


def test_spearman_bad_input():
    with pytest.raises(ValueError, match='non-finite'): spearman(torch.tensor([1., float('inf')]), torch.ones(2))
    with pytest.raises(ValueError, match='same last dim'): spearman(torch.ones(3), torch.ones(4))
    with pytest.raises(ValueError, match='at least 2'): spearman(torch.ones(1), torch.ones(1))


def test_grid_distance_written_out():
    H, W = 3, 5
    D, E = grid_distance((H, W)), grid_distance((H, W), 'euclidean')
    for i in range(H * W):
        for j in range(H * W):
            (ri, ci), (rj, cj) = divmod(i, W), divmod(j, W)
            assert D[i, j] == abs(ri - rj) + abs(ci - cj)
            assert E[i, j] == pytest.approx(math.hypot(ri - rj, ci - cj))
    iu = np.triu_indices(H * W, 1)
    np.testing.assert_array_equal(upper_pairs(D).numpy(), D.numpy()[iu])
    with pytest.raises(ValueError, match="unknown distance 'cosine'"): grid_distance(3, 'cosine')


@pytest.mark.parametrize('grid', [(4, 4), (3, 5), (1, 6)])
@pytest.mark.parametrize('metric', DISTANCES)
def test_closed_form_ssdc(grid, metric):
    D = grid_distance(grid, metric)
    assert ssdc_from_similarity(-D, grid, metric).item() == 1.0
    assert ssdc_from_similarity(D, grid, metric).item() == -1.0
    assert ssdc_from_similarity(1 / (1 + D), grid, metric).item() == pytest.approx(1.0, abs=1e-12)  # only ranks matter
    sims = torch.stack([-D, D])                                               # batched over leading dims
    np.testing.assert_array_equal(ssdc_from_similarity(sims, grid, metric).numpy(), [1., -1.])


def brute_force(feats: torch.Tensor, grid) -> tuple[np.ndarray, np.ndarray]:
    "Mean-matrix and per-image SSDC with numpy/scipy, one image at a time, float64 (written out independently)."
    f = feats.double().numpy()
    f = f / np.linalg.norm(f, axis=-1, keepdims=True)
    L, B, N, _ = f.shape
    h, w = grid
    rc = np.array([(k // w, k % w) for k in range(N)])
    d = np.abs(rc[:, None] - rc[None]).sum(-1)
    iu = np.triu_indices(N, 1)
    mats = [[f[l, b] @ f[l, b].T for b in range(B)] for l in range(L)]
    mean = np.array([ss.spearmanr(np.mean(mats[l], 0)[iu], -d[iu]).statistic for l in range(L)])
    per = np.array([[ss.spearmanr(mats[l][b][iu], -d[iu]).statistic for b in range(B)] for l in range(L)])
    return mean, per


@pytest.fixture
def toy_features():
    g = torch.Generator().manual_seed(3)
    grid = (4, 5)
    pe = sincos_2d(grid, 24)
    scale = torch.tensor([.3, 1., 3.])[:, None, None, None]
    return grid, torch.randn(3, 23, 20, 24, generator=g) + scale * pe          # (L, B, N, C)


def test_streaming_equals_one_shot_and_brute_force(toy_features):
    grid, feats = toy_features
    acc = SSDCAccumulator(grid, per_image=True)
    for s in range(0, 23, 5): acc.update(feats[:, s:s + 5])
    one = SSDCAccumulator(grid, per_image=True).update(feats)
    mean_ref, per_ref = brute_force(feats, grid)
    np.testing.assert_allclose(acc.compute().numpy(), one.compute().numpy(), atol=1e-6)
    np.testing.assert_allclose(acc.compute().numpy(), mean_ref, atol=1e-6)
    np.testing.assert_allclose(ssdc(feats, grid).numpy(), mean_ref, atol=1e-6)
    np.testing.assert_allclose(acc.image_values().numpy(), per_ref, atol=1e-6)
    np.testing.assert_allclose(ssdc_per_image(feats, grid).numpy(), per_ref, atol=1e-6)
    assert acc.n_images == 23
    assert ssdc(feats[0], grid).ndim == 0


def test_streaming_memory_does_not_grow():
    acc = SSDCAccumulator(3)
    for _ in range(20): acc.update(torch.randn(2, 16, 9, 8))
    assert acc.n_images == 320 and acc.sim_sum.shape == (2, 9, 9) and acc._image_values == []


def test_per_image_ci_contains_mean(toy_features):
    grid, feats = toy_features
    acc = SSDCAccumulator(grid, per_image=True).update(feats)
    s = acc.image_summary(seed=1)
    v = acc.image_values().numpy()
    np.testing.assert_allclose(s['value'], v.mean(1))
    assert ((s['ci_low'] < s['value']) & (s['value'] < s['ci_high'])).all()
    assert (s['ci_high'] - s['ci_low'] < 4 * v.std(1)).all()                  # an interval of the mean, not of the data
    again = acc.image_summary(seed=1)
    np.testing.assert_array_equal(s['ci_low'], again['ci_low'])               # seeded
    df = acc.to_frame(condition='toy')
    assert set(df.metric) == {'ssdc', 'ssdc_image'} and len(df) == 6 and (df.n_images == 23).all()


def test_bootstrap_ci_degenerate_rows():
    mean, lo, hi = bootstrap_ci(np.array([[1., 1., 1.], [np.nan, 2., np.nan], [0., 1., np.nan]]))
    np.testing.assert_array_equal(mean, [1., 2., .5])
    assert lo[0] == hi[0] == 1. and np.isnan(lo[1]) and lo[2] <= .5 <= hi[2]


def test_blank_images_are_left_out_with_warning():
    feats = torch.randn(1, 6, 9, 4)
    feats[:, 0] = 1.                                                          # a blank image: constant similarity
    acc = SSDCAccumulator(3, per_image=True)
    with pytest.warns(ss.ConstantInputWarning): acc.update(feats)
    with pytest.warns(UserWarning, match='constant similarity'): s = acc.image_summary()
    assert s['n_undefined'][0] == 1 and np.isfinite(s['value']).all()


def smooth_images(n, size=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return F.interpolate(torch.randn(n, 3, 4, 4, generator=g), size=size, mode='bilinear', align_corners=False)


@pytest.mark.parametrize('pe', ['none', 'ape', 'rope'])
def test_ssdc_curve_matches_recorded_features(pe):
    m = PEViT(img_size=32, patch_size=4, embed_dim=32, depth=3, num_heads=2, num_classes=5, pe=pe, drop_rate=.5)
    x = smooth_images(12)
    acc = ssdc_curve(m, [(x[:5], 0), (x[5:], 0)], per_image=True)
    m.eval()
    with torch.no_grad(), TokenRecorder(m, 'ln1') as rec: m(x)
    feats = rec.patch_tokens('ln1')                                           # (3, 12, 64, 32): LN1 input of each block
    np.testing.assert_allclose(acc.compute().numpy(), brute_force(feats, (8, 8))[0], atol=1e-6)
    np.testing.assert_allclose(acc.image_values().numpy(), ssdc_per_image(feats, 8).numpy(), atol=1e-9)
    assert m.training is False                                                # restored to the mode it was in
    m.train(); ssdc_curve(m, [x]); assert m.training


def test_ssdc_curve_on_timm_vit_and_max_images():
    m = timm.create_model('vit_tiny_patch16_224', pretrained=False, img_size=32, patch_size=4, embed_dim=32, depth=2,
                          num_heads=2, num_classes=3, reg_tokens=2)              # 1 CLS + 2 register prefix tokens
    x = smooth_images(10, seed=1)
    batches = [x[:4], x[4:8], x[8:]]
    acc = ssdc_curve(m, batches, max_images=6, layers=[1])
    ref = ssdc_curve(m, [x[:6]], layers=[1])
    assert acc.n_images == 6 and acc.layers == [1]
    np.testing.assert_allclose(acc.compute().numpy(), ref.compute().numpy(), atol=1e-6)   # float32 features: batches of 4 vs 6 differ in the last bits
    with pytest.warns(UserWarning, match='only 10 images'): ssdc_curve(m, batches, max_images=50)


def test_untrained_nope_static_prior():
    # content with spatial autocorrelation gives a positive SSDC even without any PE (SPEC §3: "static prior")
    m = PEViT(img_size=32, patch_size=4, embed_dim=32, depth=2, num_heads=2, num_classes=5, pe='none')
    assert (ssdc_curve(m, [smooth_images(16)]).compute() > .3).all()
    assert ssdc_curve(m, [torch.randn(16, 3, 32, 32)]).compute().abs().max() < .1


def test_half_precision_features():
    grid, f = (3, 3), torch.randn(2, 5, 9, 8)
    np.testing.assert_allclose(ssdc(f.half(), grid).numpy(), ssdc(f.half().float(), grid).numpy(), atol=1e-12)


def test_bad_input_errors():
    m = PEViT(img_size=16, patch_size=4, embed_dim=16, depth=1, num_heads=2, num_classes=2, pe='none')
    with pytest.raises(ValueError, match='empty'): ssdc_curve(m, [])
    with pytest.raises(ValueError, match="unknown distance 'l3'"): ssdc_curve(m, [torch.randn(2, 3, 16, 16)], metric='l3')
    with pytest.raises(ValueError, match=r"grid_size \(5, 5\) does not match the model's patch grid"): ssdc_curve(m, [torch.randn(2, 3, 16, 16)], grid_size=5)
    with pytest.raises(ValueError, match='non-finite'): ssdc_curve(m, [torch.full((1, 3, 16, 16), float('nan'))])
    with pytest.raises(ValueError, match='float image tensor'): ssdc_curve(m, [[np.zeros((1, 3, 16, 16))]])
    with pytest.raises(ValueError, match='max_images'): ssdc_curve(m, [torch.randn(2, 3, 16, 16)], max_images=0)
    acc = SSDCAccumulator((2, 3))
    with pytest.raises(ValueError, match='got 7 tokens'): acc.update(torch.randn(1, 2, 7, 4))
    with pytest.raises(ValueError, match=r'\(L, B, N, C\)'): acc.update(torch.randn(6, 4))
    with pytest.raises(ValueError, match='non-finite'): acc.update(torch.full((1, 2, 6, 4), float('inf')))
    with pytest.raises(ValueError, match='no images'): acc.compute()
    acc.update(torch.randn(2, 3, 6, 4))
    with pytest.raises(ValueError, match='expected 2'): acc.update(torch.randn(3, 3, 6, 4))
    with pytest.raises(ValueError, match='per_image=True'): acc.image_values()


@pytest.mark.cuda
def test_spearman_and_ssdc_on_cuda_match_cpu():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(40, 500, generator=g), torch.randint(0, 9, (500,), generator=g).float()
    np.testing.assert_allclose(spearman(a.cuda(), b.cuda()).cpu().numpy(), spearman(a, b).numpy(), atol=1e-10)
    f = torch.randn(2, 6, 16, 8, generator=g)
    acc = SSDCAccumulator(4, per_image=True).update(f.cuda())
    np.testing.assert_allclose(acc.compute().cpu().numpy(), ssdc(f, 4).numpy(), atol=1e-6)
    np.testing.assert_allclose(acc.image_values().numpy(), ssdc_per_image(f, 4).numpy(), atol=1e-6)
