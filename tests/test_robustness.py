"""Robustness shifts, the evaluator, fragility aggregation and the corrupted-set cache (exported package).

References are written out here, independently of the module: PSNR, a PIL encode/decode loop, a brute-force
per-channel Gaussian convolution, the FS formula, numpy's sample SD.
"""
import io, json, math, warnings

import numpy as np
import pandas as pd
import pytest
import timm
import torch
from torch import nn
from PIL import Image

from pe_anchors.robustness import (JPEG, GaussianBlur, BlockShuffle, PatchMask, make_shift, paper_shifts,
                                   imagenet_c_shifts, structure_shifts, evaluate_accuracy, evaluate_shifts,
                                   shifted_set, TensorBatches, make_normalize, to_blocks, blur_images, channel_mean)
from pe_anchors.results import summarize_fragility, fragility
from pe_anchors.paper import paper_table5
from pe_anchors.plots import plot_fragility, plot_shift_curves


# ---------------------------------------------------------------- helpers (independent references)
def psnr_np(a: torch.Tensor, b: torch.Tensor) -> np.ndarray:
    "Per-image PSNR in dB, written out with numpy."
    a, b = a.numpy().astype(np.float64), b.numpy().astype(np.float64)
    mse = ((a - b) ** 2).reshape(len(a), -1).mean(1)
    with np.errstate(divide='ignore'): return 10 * np.log10(255.0 ** 2 / mse)


def pil_jpeg(x: torch.Tensor, quality: int) -> torch.Tensor:
    out = []
    for img in x:
        buf = io.BytesIO()
        Image.fromarray(img.permute(1, 2, 0).numpy()).save(buf, format='JPEG', quality=quality)
        buf.seek(0)
        out.append(torch.from_numpy(np.array(Image.open(buf).convert('RGB'))).permute(2, 0, 1))
    return torch.stack(out)


def brute_force_blur(x: torch.Tensor, sigma: float, k: int) -> torch.Tensor:
    "Per-channel 2-D Gaussian convolution with reflect padding, as explicit loops over pixels and taps."
    r = k // 2
    t = np.arange(-r, r + 1)
    w1 = np.exp(-0.5 * (t / sigma) ** 2); w1 /= w1.sum()
    w2 = np.outer(w1, w1)
    a = x.numpy().astype(np.float64)
    B, C, H, W = a.shape
    refl = lambda i, n: -i if i < 0 else (2 * (n - 1) - i if i > n - 1 else i)
    out = np.zeros_like(a)
    for b in range(B):
        for c in range(C):                     # each channel on its own
            for i in range(H):
                for j in range(W):
                    s = 0.0
                    for di in range(-r, r + 1):
                        for dj in range(-r, r + 1):
                            s += w2[di + r, dj + r] * a[b, c, refl(i + di, H), refl(j + dj, W)]
                    out[b, c, i, j] = s
    return torch.from_numpy(np.clip(np.round(out), 0, 255).astype(np.uint8))


def smooth_images(n, size, seed=0):
    g = torch.Generator().manual_seed(seed)
    lo = torch.rand(n, 3, size // 4, size // 4, generator=g)
    return (torch.nn.functional.interpolate(lo, size=(size, size), mode='bilinear') * 255).round().to(torch.uint8)


@pytest.fixture(scope='module')
def cifar(request):
    "300 real CIFAR-10 test images (uint8, 32 px), or skip."
    path = request.getfixturevalue('cifar_npz')
    from torchvision.io import decode_jpeg, ImageReadMode
    z = np.load(path)
    buf, off = z['val_jpeg'], z['val_offsets']
    idx = np.random.default_rng(0).choice(len(off) - 1, 300, replace=False)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', DeprecationWarning)
        x = torch.stack([decode_jpeg(torch.from_numpy(buf[off[i]:off[i + 1]].copy()), mode=ImageReadMode.RGB)
                         for i in idx])
    return x, torch.from_numpy(z['val_labels'][idx]).long()


# ---------------------------------------------------------------- fragility arithmetic
def test_fragility_formula_and_aggregation():
    acc_clean = {('ape', 0): .64, ('ape', 1): .66, ('rope', 0): .70, ('rope', 1): .68}
    acc_jpeg = {('ape', 0): .36, ('ape', 1): .37, ('rope', 0): .49, ('rope', 1): .47}
    rows = []
    for (c, s), a in acc_clean.items():
        rows.append(dict(condition=c, seed=s, shift='clean', kind='clean', severity=None, level=np.nan, acc=a,
                         acc_clean=a))
        rows.append(dict(condition=c, seed=s, shift='jpeg/paper', kind='jpeg', severity='paper', level=5.,
                         acc=acc_jpeg[c, s], acc_clean=a))
    df = pd.DataFrame(rows)
    df['fs'] = fragility(df.acc, df.acc_clean)
    summ = summarize_fragility(df).set_index(['condition', 'shift'])
    for c in ('ape', 'rope'):
        fs = [1 - acc_jpeg[c, s] / acc_clean[c, s] for s in (0, 1)]
        assert summ.loc[(c, 'jpeg/paper'), 'fs_mean'] == pytest.approx(sum(fs) / 2)
        assert summ.loc[(c, 'jpeg/paper'), 'fs_sd'] == pytest.approx(np.std(fs, ddof=1))
        assert summ.loc[(c, 'clean'), 'fs_mean'] == 0
        assert summ.loc[(c, 'jpeg/paper'), 'n_seeds'] == 2
        clean = [acc_clean[c, s] for s in (0, 1)]
        assert summ.loc[(c, 'clean'), 'acc_clean_sd'] == pytest.approx(np.std(clean, ddof=1))
        assert summ.loc[(c, 'jpeg/paper'), 'acc_mean'] == pytest.approx(np.mean([acc_jpeg[c, s] for s in (0, 1)]))
    assert fragility(0.25, 0.5) == pytest.approx(0.5)
    assert torch.allclose(fragility(torch.tensor([.3, .6]), torch.tensor([.6, .6])), torch.tensor([.5, 0.]))


def test_paper_table5_values():
    t = paper_table5().set_index(['condition', 'shift'])
    assert t.loc[('rope', 'jpeg/paper'), 'fs_mean'] == .2988 and t.loc[('nope', 'blur/paper'), 'fs_sd'] == .0085
    assert t.loc[('ape', 'jpeg/paper'), 'acc_clean_mean'] == .6406


# ---------------------------------------------------------------- JPEG
def test_jpeg_quality_extremes_on_cifar(cifar):
    x, _ = cifar
    p100, p5, p25 = (psnr_np(JPEG(q)(x), x) for q in (100, 5, 25))
    # q=100: quantisation step 1 for every DCT coefficient; the loss left is rounding and 4:2:0 chroma
    # subsampling, so the mean PSNR stays above 40 dB (the usual "visually lossless" threshold) and no
    # image falls below 30 dB (strongly coloured edges lose chroma detail).
    assert np.mean(np.minimum(p100, 99)) > 40 and p100.min() > 30
    # q=5: the IJG tables are scaled by 5000/q % = 10x, 8x8 blocks lose nearly all AC terms: < 25 dB on average
    assert np.mean(p5) < 25 and np.all(p5 < p100)
    assert np.mean(p5) < np.mean(p25) < np.mean(np.minimum(p100, 99))  # monotone in quality


def test_jpeg_matches_pil_within_tolerance(cifar):
    x, _ = cifar
    for q in (5, 7, 25, 75):
        ours, ref = JPEG(q)(x[:100]), pil_jpeg(x[:100], q)
        d = (ours.int() - ref.int()).abs().float()
        # both are libjpeg(-turbo) with the IJG tables and 4:2:0: allow a different build's rounding (< 0.5 grey
        # levels on average, > 40 dB between them); on the pinned stack they are bit-identical
        assert d.mean() < .5, (q, d.mean())
        assert np.all(psnr_np(ours, ref) > 40)


def grey_textured(n=40, size=32):
    "Grey (R = G = B) smooth images with pixel noise: no chroma, so 4:2:0 subsampling loses nothing."
    g = torch.Generator().manual_seed(0)
    grey = smooth_images(n, size, seed=3)[:, :1].int() + torch.randint(-20, 21, (n, 1, size, size), generator=g)
    return grey.clamp(0, 255).to(torch.uint8).expand(-1, 3, -1, -1).contiguous()


def test_jpeg_quality_extremes_synthetic():
    x = grey_textured()
    p100, p5 = psnr_np(JPEG(100)(x), x), psnr_np(JPEG(5)(x), x)
    # without chroma, q=100 only rounds (DCT, colour conversion): errors of about one grey level, i.e. >= 48 dB
    assert p100.min() > 48
    # q=5 scales the IJG tables by 5000/q % = 10x (luminance steps 160..255, clipped) against steps of 1 at q=100:
    # most AC coefficients vanish, < 25 dB
    assert p5.max() < 25
    d = (JPEG(5)(x).int() - pil_jpeg(x, 5).int()).abs().float()
    assert d.mean() < .5 and np.all(psnr_np(JPEG(5)(x), pil_jpeg(x, 5)) > 40)


def test_jpeg_deterministic_grayscale_and_errors():
    x = smooth_images(3, 24)
    assert torch.equal(JPEG(10)(x), JPEG(10)(x))
    g = JPEG(10)(x[:, :1])
    assert g.shape == (3, 1, 24, 24) and g.dtype == torch.uint8
    for q in (0, 101, -5, 50.5, True):
        with pytest.raises(ValueError, match='1..100'): JPEG(q)
    with pytest.raises(ValueError, match='uint8'): JPEG(5)(x.float())
    with pytest.raises(ValueError, match='1 or 3 channels'): JPEG(5)(torch.zeros(1, 2, 8, 8, dtype=torch.uint8))


# ---------------------------------------------------------------- blur
def test_blur_equals_brute_force_convolution():
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 256, (2, 3, 11, 9), dtype=torch.uint8, generator=g)
    for sigma, k in ((2.5, 5), (1.0, 7), (0.7, 3)):
        ours, ref = blur_images(x, sigma, k), brute_force_blur(x, sigma, k)
        d = (ours.int() - ref.int()).abs()
        assert d.max() <= 1 and (d > 0).float().mean() < .01, (sigma, k)   # float32 vs float64 at .5 boundaries


def test_blur_sigma_to_zero_is_identity_and_channels_stay_separate():
    x = smooth_images(2, 32)
    assert torch.equal(GaussianBlur(1e-3, 5)(x), x)
    assert torch.equal(GaussianBlur(1e-3, None)(x), x)
    red = x.clone(); red[:, 1:] = 0
    out = GaussianBlur(4.0, 15)(red)
    assert out[:, 1:].count_nonzero() == 0 and out[:, 0].count_nonzero() > 0
    assert not torch.equal(out[:, 0], red[:, 0])                          # the red channel itself was blurred
    # a single bright pixel spreads only within its own channel, symmetrically
    dot = torch.zeros(1, 3, 15, 15, dtype=torch.uint8); dot[0, 1, 7, 7] = 255
    out = GaussianBlur(1.5, 7)(dot)
    assert out[0, [0, 2]].count_nonzero() == 0
    assert torch.equal(out[0, 1], out[0, 1].flip(0)) and torch.equal(out[0, 1], out[0, 1].T)


def test_blur_resolution_scaling_and_description():
    b = GaussianBlur(2.5, 5, img_size=32)
    assert b.sigma == pytest.approx(2.5 * 32 / 224) and b.kernel_size == 3
    assert '0.3571' in b.description() and 'kernel 3' in b.description() and '32/224' in b.description()
    assert GaussianBlur(2.5, 5, img_size=224).kernel_size == 5
    assert GaussianBlur(2.5, 5, img_size=448).kernel_size == 9 and GaussianBlur(2.5, 5, img_size=448).sigma == 5.0
    c = make_shift('blur', 5, img_size=224)                               # ImageNet-C sigma 6: truncate-4 radius 24
    assert c.kernel_size == 49 and c.sigma == 6.0
    with pytest.raises(ValueError, match='scaled for 32 px'): b(torch.zeros(1, 3, 64, 64, dtype=torch.uint8))


@pytest.mark.parametrize('bad', [dict(sigma=0), dict(sigma=-1.), dict(sigma=math.inf), dict(kernel_size=4),
                                 dict(kernel_size=0), dict(kernel_size=3.0)])
def test_blur_bad_parameters(bad):
    with pytest.raises(ValueError, match='sigma|odd'): GaussianBlur(**{'sigma': 1., **bad})


def test_blur_kernel_too_large_for_image():
    with pytest.raises(ValueError, match='too large'): GaussianBlur(2., 11)(torch.zeros(1, 3, 5, 5, dtype=torch.uint8))


# ---------------------------------------------------------------- block shuffle / masking
def test_block_shuffle_identity_and_permutation_of_blocks(cifar):
    x, _ = cifar
    x = x[:20]
    assert torch.equal(BlockShuffle(1)(x), x)
    for g in (2, 4, 8, 16):
        y = BlockShuffle(g, seed=3)(x)
        assert torch.equal(y.flatten(1).sort(1).values, x.flatten(1).sort(1).values)  # pixel multiset kept
        bi, bo = to_blocks(x, g), to_blocks(y, g)                         # (B, N, C, bh, bw)
        for b in range(len(x)):
            # the blocks of the output are the blocks of the input, each intact, as a multiset (duplicates allowed)
            blocks_in = sorted(blk.numpy().tobytes() for blk in bi[b])
            blocks_out = sorted(blk.numpy().tobytes() for blk in bo[b])
            assert blocks_in == blocks_out
        assert not torch.equal(y, x)


def test_block_shuffle_seeded_and_batch_independent():
    x = smooth_images(6, 32)
    s = BlockShuffle(4, seed=7)
    y = s(x)
    assert torch.equal(torch.cat([s(x[:2]), s(x[2:], offset=2)]), y)
    assert torch.equal(BlockShuffle(4, seed=7)(x), y) and not torch.equal(BlockShuffle(4, seed=8)(x), y)
    with pytest.raises(ValueError, match='does not divide'): BlockShuffle(5)(x)
    with pytest.raises(ValueError, match='does not divide'): PatchMask(.5, grid=6)(x)


@pytest.mark.parametrize('ratio', [0., .1, .25, .5, .9, 1.])
def test_mask_ratio_honoured_exactly(ratio):
    grid, S = 8, 32
    x = smooth_images(5, S)
    fill = (.2, .4, .6)
    m = PatchMask(ratio, grid=grid, fill=fill, seed=1)
    y = m(x)
    mask = m.mask(5)
    expected = math.floor(ratio * grid * grid + .5)
    assert mask.flatten(1).sum(1).tolist() == [expected] * 5
    pix = mask.repeat_interleave(S // grid, 1).repeat_interleave(S // grid, 2)   # (B, H, W)
    colour = torch.tensor([round(255 * f) for f in fill], dtype=torch.uint8)
    for c in range(3):
        assert torch.all(y[:, c][pix] == colour[c])
        assert torch.equal(y[:, c][~pix], x[:, c][~pix])


def test_mask_bad_ratio_and_fill():
    with pytest.raises(ValueError, match=r'\[0, 1\]'): PatchMask(1.2)
    with pytest.raises(ValueError, match=r'\[0, 1\]'): PatchMask(.5, fill=(128, 128, 128))


def test_severity_tables():
    assert [s.quality for s in imagenet_c_shifts('jpeg')] == [25, 18, 15, 10, 7]
    assert [s.sigma for s in imagenet_c_shifts('blur')] == [1, 2, 3, 4, 6]
    jp, bl = paper_shifts()
    assert (jp.quality, bl.sigma, bl.kernel_size) == (5, 2.5, 5)
    assert [s.name for s in structure_shifts('shuffle')] == ['shuffle/g1', 'shuffle/g2', 'shuffle/g4', 'shuffle/g8',
                                                             'shuffle/g16']
    assert len(structure_shifts('mask')) == 10
    with pytest.raises(ValueError, match='valid'): make_shift('jpeg', 0)


# ---------------------------------------------------------------- evaluator
class PixelVote(nn.Module):
    "Class = argmax over the first K pixels of the first channel of the (normalised) input."
    def __init__(self, k=10):
        super().__init__(); self.k = k; self.w = nn.Parameter(torch.ones(()))
    def forward(self, x): return x[:, 0].flatten(1)[:, :self.k] * self.w


def test_evaluate_accuracy_against_written_out_loop():
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (70, 3, 16, 16), dtype=torch.uint8, generator=g)
    y = torch.randint(0, 10, (70,), generator=g)
    model = PixelVote().train()
    shift = BlockShuffle(4, seed=2)
    mean, std = (.5, .5, .5), (.25, .25, .25)
    correct = 0
    for i in range(70):
        xi = shift(x[i:i + 1], offset=i).float() / 255
        xi = (xi - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)
        correct += int(model(xi).argmax() == y[i])
    acc = evaluate_accuracy(model, TensorBatches(x, y, 16), (mean, std), shift=shift, show=False)
    assert acc == pytest.approx(correct / 70)
    assert model.training                                                     # mode restored
    assert evaluate_accuracy(model, [(x[:35], y[:35]), (x[35:], y[35:])], (mean, std), shift=shift) == acc


def test_plain_callable_shift_and_channel_mean():
    x = smooth_images(12, 16); y = torch.arange(12) % 10
    m = PixelVote()
    flipped = evaluate_accuracy(m, [(x.flip(-1), y)], ((.5,) * 3, (.2,) * 3))
    assert evaluate_accuracy(m, [(x[:5], y[:5]), (x[5:], y[5:])], ((.5,) * 3, (.2,) * 3),
                             shift=lambda t: t.flip(-1)) == flipped
    want = x.numpy().astype(np.float64).mean(axis=(0, 2, 3)) / 255
    assert np.allclose(channel_mean([(x[:7], y[:7]), (x[7:], y[7:])]), want)


def test_evaluate_accuracy_any_classifier_timm_cnn():
    cnn = timm.create_model('resnet18', pretrained=False, num_classes=10)
    x = smooth_images(8, 32); y = torch.arange(8) % 10
    acc = evaluate_accuracy(cnn, [(x, y)], normalize=None, shift=JPEG(5))
    assert 0 <= acc <= 1 and cnn.training
    with pytest.raises(ValueError, match='uint8'): evaluate_accuracy(cnn, [(x.float(), y)])
    with pytest.raises(ValueError, match='no images'): evaluate_accuracy(cnn, [])


def test_evaluate_accuracy_low_precision_model():
    x = smooth_images(10, 16); y = torch.arange(10) % 10
    # the input follows the model's dtype (a float32 input would fail in a float64 / bf16 linear layer)
    lin = lambda dtype: nn.Sequential(nn.Flatten(), nn.Linear(3 * 16 * 16, 10)).to(dtype)
    torch.manual_seed(1); m64 = lin(torch.float64)
    torch.manual_seed(1); m32 = lin(torch.float32)
    assert evaluate_accuracy(m64, [(x, y)]) == evaluate_accuracy(m32, [(x, y)])
    assert 0 <= evaluate_accuracy(lin(torch.bfloat16), [(x, y)]) <= 1


def test_make_normalize():
    x = torch.tensor([0, 51, 255], dtype=torch.uint8).view(1, 3, 1, 1)
    n = make_normalize(((.1, .2, .3), (.5, .5, .5)))
    assert torch.allclose(n(x).flatten(), torch.tensor([(0 - .1) / .5, (.2 - .2) / .5, (1 - .3) / .5]))
    m = timm.create_model('pe_vit_nano_patch1_8', pe='ape')
    assert torch.allclose(make_normalize(None, m)(x), make_normalize((m.pretrained_cfg['mean'], m.pretrained_cfg['std']))(x))
    with pytest.raises(ValueError, match='std > 0'): make_normalize(((0, 0, 0), (1, 0, 1)))


def test_evaluate_shifts_tidy_frame():
    x = smooth_images(24, 16); y = torch.arange(24) % 10
    models = {('ape', 0): PixelVote(10), ('ape', 1): PixelVote(12), 'rope': PixelVote(11)}
    df = evaluate_shifts(models, TensorBatches(x, y, 10), paper_shifts(16) + [BlockShuffle(2)], normalize=None,
                         show=False)
    assert len(df) == 3 * 4 and set(df['shift']) == {'clean', 'jpeg/paper', 'blur/paper', 'shuffle/g2'}
    assert np.allclose(df.fs, 1 - df.acc / df.acc_clean)
    for (c, s), m in (((k if isinstance(k, tuple) else (k, 0)), m) for k, m in models.items()):
        row = df[(df.condition == c) & (df.seed == s) & (df['shift'] == 'jpeg/paper')].iloc[0]
        assert row.acc == pytest.approx(evaluate_accuracy(m, [(x, y)], shift=JPEG(5)))
    summ = summarize_fragility(df)
    assert set(summ.columns) >= {'condition', 'shift', 'fs_mean', 'fs_sd', 'acc_mean', 'n_seeds'}
    import matplotlib; matplotlib.use('Agg')
    plot_fragility(summ); plot_shift_curves(summ, 'shuffle', metric='acc')
    with pytest.raises(ValueError, match='unique'): evaluate_shifts(models, [(x, y)], [JPEG(5), JPEG(5)])


# ---------------------------------------------------------------- cache
def test_cache_hit_invalidation_and_atomic_write(tmp_path, cifar):
    x, y = cifar
    data = TensorBatches(x[:40], y[:40], 16)
    calls = []
    class Counted(JPEG):
        def apply(self, t, offset): calls.append(len(t)); return super().apply(t, offset)
    a = shifted_set(data, Counted(10), cache_dir=tmp_path, dataset_id='cifar-test-32')
    assert sum(calls) == 40 and len(list(tmp_path.iterdir())) == 1
    b = shifted_set(data, Counted(10), cache_dir=tmp_path, dataset_id='cifar-test-32')
    assert sum(calls) == 40 and torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])   # served from disk
    assert torch.equal(a[0], JPEG(10)(x[:40]))
    shifted_set(data, Counted(11), cache_dir=tmp_path, dataset_id='cifar-test-32')      # parameter change: new file
    assert sum(calls) == 80
    shifted_set(TensorBatches(x[1:41], y[1:41], 16), Counted(10), cache_dir=tmp_path, dataset_id='cifar-test-32')
    assert sum(calls) == 120                                                              # other data: fingerprint
    files = sorted(p.name for p in tmp_path.iterdir())
    assert len(files) == 3 and not any(f.endswith('.tmp') for f in files)
    # a file whose stored key disagrees (e.g. renamed by hand) is recomputed, not trusted
    from safetensors.torch import save_file
    victim = next(p for p in tmp_path.iterdir() if 'q11' in p.name)
    save_file(dict(images=torch.zeros(40, 3, 32, 32, dtype=torch.uint8), labels=torch.zeros(40, dtype=torch.long)),
              str(victim), metadata=dict(key=json.dumps({'other': 1})))
    c = shifted_set(data, Counted(11), cache_dir=tmp_path, dataset_id='cifar-test-32')
    assert sum(calls) == 160 and torch.equal(c[0], JPEG(11)(x[:40]))
    with pytest.raises(ValueError, match='dataset_id'): shifted_set(data, JPEG(5), cache_dir=tmp_path)


def test_interrupted_write_leaves_no_file(tmp_path):
    x = smooth_images(4, 16); y = torch.zeros(4, dtype=torch.long)
    class Boom(JPEG):
        def apply(self, t, offset):
            if offset > 0: raise KeyboardInterrupt
            return super().apply(t, offset)
    with pytest.raises(KeyboardInterrupt):
        shifted_set(TensorBatches(x, y, 2), Boom(5), cache_dir=tmp_path, dataset_id='d')
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- GPU path
@pytest.mark.cuda
def test_cuda_shifts_match_cpu():
    x = smooth_images(16, 64)
    xc = x.cuda()
    for s in (BlockShuffle(8, seed=1), PatchMask(.5, grid=8), GaussianBlur(2.5, 5), GaussianBlur(6., None)):
        d = (s(xc).cpu().int() - s(x).int()).abs()
        assert d.max() <= 1, s                       # exact for shuffle/mask; float rounding for blur
    j = JPEG(5)(xc)
    assert j.is_cuda and j.shape == x.shape
    assert np.all(psnr_np(j.cpu(), JPEG(5)(x)) > 30)  # nvJPEG is close to libjpeg but not bit-identical


@pytest.mark.parametrize('severity', [1, 3, 5])
def test_imagenet_c_blur_matches_skimage_semantics(severity):
    # ImageNet-C: skimage.filters.gaussian (scipy 'nearest' border, truncate 4) on x/255, then np.uint8 (truncation).
    from scipy.ndimage import gaussian_filter
    x = torch.randint(0, 256, (2, 3, 40, 40), dtype=torch.uint8, generator=torch.Generator().manual_seed(severity))
    s = make_shift('blur', severity)
    ref = gaussian_filter(x.double().numpy() / 255, (0, 0, s.sigma, s.sigma), mode='nearest', truncate=4.)
    ref = np.uint8(np.clip(ref, 0, 1) * 255)
    ours = s(x).numpy()
    assert np.abs(ours.astype(int) - ref).max() <= 1 and (ours == ref).mean() > .99
    # the paper's blur keeps torchvision's mirrored border and rounding
    assert make_shift('blur', 'paper').params['padding'] == 'reflect'


def test_one_normalisation_for_training_evaluation_and_shifts():
    "A (mean, std) pair, the data's own `normalize` and the training loaders' `BatchAug` give the same floats, bit for bit."
    from pe_anchors.data import BatchAug, Normalize, digits
    d = digits()
    x = d.valid.images[:16]
    f = make_normalize((d.mean, d.std))
    assert isinstance(f, Normalize)
    assert torch.equal(f(x), d.normalize(x)) and torch.equal(f(x), BatchAug(d.img_size, d.mean, d.std).norm(x))
    ref = (x.double() / 255 - torch.tensor(d.mean, dtype=torch.float64)[:, None, None]) / torch.tensor(d.std, dtype=torch.float64)[:, None, None]
    torch.testing.assert_close(f(x).double(), ref, rtol=1e-6, atol=1e-6)         # the formula, written out
    with pytest.raises(ValueError, match='normalize must be'): make_normalize((1, 2, 3))


@pytest.mark.parametrize('severity', ['paper', 1, 2, 3, 4, 5])
def test_blur_keeps_flat_images_at_their_level(severity):
    "A flat image is a fixed point of any normalised blur: every level stays itself (it came out one darker at 4-5)."
    from pe_anchors.robustness import make_shift
    for size, levels in ((64, torch.arange(256)), (224, torch.tensor([0, 1, 127, 128, 254, 255]))):
        x = levels.to(torch.uint8).view(-1, 1, 1, 1).expand(-1, 3, size, size).contiguous()       # flat images
        s = make_shift('blur', severity, img_size=size, ref_size=size)
        assert torch.equal(s(x), x), (severity, size, s.description())


def test_the_shift_cache_follows_the_content_and_its_checksum(tmp_path):
    from pe_anchors.robustness import JPEG, TensorBatches, shifted_set
    x = torch.randint(0, 256, (40, 3, 16, 16), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    y = torch.arange(40) % 10
    a, _ = shifted_set(TensorBatches(x, y, 16), JPEG(20), cache_dir=tmp_path, dataset_id='d')
    more = torch.cat([x, x[:20]]), torch.cat([y, y[:20]])                       # the folder grew
    b, _ = shifted_set(TensorBatches(*more, 16), JPEG(20), cache_dir=tmp_path, dataset_id='d')
    assert len(b) == 60 and len(list(tmp_path.glob('*.safetensors'))) == 2
    f = sorted(tmp_path.glob('*.safetensors'), key=lambda p: p.stat().st_size)[0]
    raw = bytearray(f.read_bytes()); raw[-3] ^= 0xFF; f.write_bytes(bytes(raw))  # flipped bits
    with pytest.warns(UserWarning, match='damaged cache file'):
        c, _ = shifted_set(TensorBatches(x, y, 16), JPEG(20), cache_dir=tmp_path, dataset_id='d')
    assert torch.equal(a, c)
