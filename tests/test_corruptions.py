"""CIFAR-10-C corruptions (exported package): constants, shapes, determinism, severity ordering, and every corruption
against its reference definition (hendrycks/robustness, ImageNet-C/create_c/make_cifar_c.py).

The references are written out here, independently of the module: the noise formulas with numpy (drawing from the
per-image generator the module documents, in the reference's order), Python's `colorsys` for HSV, explicit loops for
the Gaussian, defocus and motion blurs and for the affine warp, `scipy.ndimage.zoom` for the zooms, PIL for JPEG and a
hand-written copy of PIL's BOX resampling for pixelate.
"""
import colorsys, io, math, os, re, sys, types, zlib

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn
from PIL import Image
from scipy import ndimage

import pe_anchors.corruptions as corruptions
from pe_anchors.corruptions import (CORRUPTIONS, CIFAR_C_NAMES, EXTRA_NAMES, Corruption, FROST_FILES, FROST_INSTALL,
                                    available_corruptions, cifar_c_shifts, corrupt, default_frost_dir, frost,
                                    motion_blur_images, sample_photos)
from pe_anchors.robustness import ShiftedSets, TensorBatches, evaluate_shifts

NAMES = available_corruptions(extra=True)            # the 17 that run here, and frost with its photographs (the extra)
RANDOM = [n for n in NAMES if CORRUPTIONS[n]['random']]


# ---------------------------------------------------------------- helpers (independent references)
def hwc(x: torch.Tensor) -> np.ndarray: return x.permute(0, 2, 3, 1).numpy()
def chw(a: np.ndarray) -> torch.Tensor: return torch.from_numpy(np.ascontiguousarray(a)).permute(0, 3, 1, 2).contiguous()
def store(y: np.ndarray) -> np.ndarray: return np.uint8(np.clip(y, 0, 1) * 255)     # the reference's last line


def psnr_np(a: torch.Tensor, b: torch.Tensor) -> np.ndarray:
    "Per-image PSNR in dB (capped at 99 for identical images)."
    mse = ((a.numpy().astype(np.float64) - b.numpy().astype(np.float64)) ** 2).reshape(len(a), -1).mean(1)
    with np.errstate(divide='ignore'): return np.minimum(10 * np.log10(255.0 ** 2 / mse), 99)


def gen(name: str, severity: int, index: int, seed: int = 0) -> np.random.Generator:
    "The per-image generator the module documents: default_rng([seed, crc32(name), severity, index])."
    return np.random.default_rng([seed, zlib.crc32(name.encode()), severity, index])


def close_levels(a: np.ndarray, b: np.ndarray, exact: float = .99):
    "Two uint8 images agree to one level everywhere and exactly almost everywhere (float rounding at a truncation)."
    d = np.abs(a.astype(int) - b.astype(int))
    assert d.max() <= 1, d.max()
    assert (d == 0).mean() >= exact, (d == 0).mean()


@pytest.fixture(scope='module')
def photos() -> torch.Tensor:
    return sample_photos(8)


@pytest.fixture(scope='module')
def noise_images() -> torch.Tensor:
    return torch.randint(0, 256, (3, 3, 32, 32), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))


# ---------------------------------------------------------------- the table
def test_the_suite_is_cifar10c_with_its_own_constants():
    assert len(CIFAR_C_NAMES) == 15 and set(CIFAR_C_NAMES) | set(EXTRA_NAMES) == set(CORRUPTIONS)
    cats = {'noise': {'gaussian_noise', 'shot_noise', 'impulse_noise'},
            'blur': {'defocus_blur', 'glass_blur', 'motion_blur', 'zoom_blur'},
            'weather': {'snow', 'frost', 'fog', 'brightness'},
            'digital': {'contrast', 'elastic_transform', 'pixelate', 'jpeg_compression'}}
    for cat, names in cats.items():
        assert {n for n in CIFAR_C_NAMES if CORRUPTIONS[n]['category'] == cat} == names
    # make_cifar_c.py's constants, typed here from the reference (ImageNet-C's differ: JPEG 25..7, noise .08..38)
    ref = dict(jpeg_compression=[80, 65, 58, 50, 40], gaussian_blur=[.4, .6, .7, .8, 1],
               gaussian_noise=[.04, .06, .08, .09, .10], shot_noise=[500, 250, 100, 75, 50],
               impulse_noise=[.01, .02, .03, .05, .07], speckle_noise=[.06, .1, .12, .16, .2],
               contrast=[.75, .5, .4, .3, .15], brightness=[.05, .1, .15, .2, .3], pixelate=[.95, .9, .85, .75, .65],
               motion_blur=[(6, 1), (6, 1.5), (6, 2), (8, 2), (9, 2.5)],
               glass_blur=[(.05, 1, 1), (.25, 1, 1), (.4, 1, 1), (.25, 1, 2), (.4, 1, 2)],
               fog=[(.2, 3), (.5, 3), (.75, 2.5), (1, 2), (1.5, 1.75)])
    for n, c in ref.items(): assert list(CORRUPTIONS[n]['constants']) == c, n
    assert CORRUPTIONS['spatter']['status'] == 'omitted' and CORRUPTIONS['frost']['status'] == 'needs frost images'


# ---------------------------------------------------------------- interface: shapes, determinism, errors
@pytest.mark.parametrize('name', NAMES)
def test_uint8_of_the_input_shape_and_deterministic(name, noise_images):
    x = noise_images
    y = corrupt(x, name, 3)
    assert y.dtype == torch.uint8 and y.shape == x.shape
    assert torch.equal(corrupt(x, name, 3), y)                                         # rebuilt: identical
    assert torch.equal(torch.cat([corrupt(x[:1], name, 3), corrupt(x[1:], name, 3, offset=1)]), y)   # batching
    assert torch.equal(corrupt(x, name, 3, seed=1), y) == (not CORRUPTIONS[name]['random'])   # other seed
    one = corrupt(x[2:], name, 1, offset=2)
    assert one.shape == (1, 3, 32, 32) and torch.equal(one, corrupt(x, name, 1)[2:])


def test_errors_say_what_is_wrong(noise_images):
    x = noise_images
    for bad in (0, 6, True, 2.5):
        with pytest.raises(ValueError, match='1..5'): corrupt(x, 'fog', bad)
    with pytest.raises(ValueError, match='valid'): corrupt(x, 'rain', 1)
    with pytest.raises(ValueError, match='not implemented'): corrupt(x, 'spatter', 2)
    with pytest.raises(ValueError, match='RGB'): corrupt(x[:, :1], 'fog', 1)
    with pytest.raises(ValueError, match='uint8'): corrupt(x.float(), 'fog', 1)
    with pytest.raises(ValueError, match='seed'): corrupt(x, 'fog', 1, seed=-1)
    with pytest.raises(FileNotFoundError, match='frost1.png'): Corruption('frost', 1, frost_dir='nowhere')


def test_without_the_photographs_frost_says_how_to_install_them(noise_images, monkeypatch):
    monkeypatch.setattr(corruptions, 'default_frost_dir', lambda: None)        # a machine without the `corruptions` extra
    for call in (lambda: corrupt(noise_images, 'frost', 1), lambda: Corruption('frost', 1)):
        with pytest.raises(ValueError, match=re.escape(FROST_INSTALL)) as e: call()
        assert '\n' not in str(e.value)
    assert 'frost' not in available_corruptions() and len(cifar_c_shifts()) == 14 * 5


# ---------------------------------------------------------------- severity ordering
MONOTONE = [n for n in NAMES if n not in ('glass_blur', 'elastic_transform', 'saturate', 'motion_blur', 'frost')]


@pytest.mark.parametrize('name', MONOTONE)
def test_psnr_falls_with_severity(name, photos):
    p = [psnr_np(corrupt(photos, name, s), photos).mean() for s in range(1, 6)]
    assert all(a >= b for a, b in zip(p, p[1:])), p
    assert p[0] > p[-1] + 1, p                                        # and it does fall


def test_glass_blur_and_saturate_orderings_the_constants_give(photos):
    p = {n: [psnr_np(corrupt(photos, n, s), photos).mean() for s in range(1, 6)] for n in ('glass_blur', 'saturate')}
    g, s = p['glass_blur'], p['saturate']
    assert g[3] < g[1] and g[4] < g[2]                 # same σ, a second pass of moves: further from the clean image
    assert s[1] < s[0] and s[2] > s[3] > s[4]          # desaturation .3 -> .1; oversaturation 1.5 -> 2.5


def test_motion_blur_at_fixed_angles_does_not_get_sharper(photos):
    a = hwc(photos)
    for angle in (-45, 0, 30):
        p = [psnr_np(chw(motion_blur_images(a, *c, [angle] * len(a))), photos).mean()
             for c in CORRUPTIONS['motion_blur']['constants']]
        assert all(x >= y for x, y in zip(p, p[1:])) and p[0] > p[-1] + 2, (angle, p)


def test_elastic_nonaffine_displacement_grows_with_severity():
    "Read positions off a ramp whose colour encodes (row, col); what the best affine fit leaves grows with severity."
    r, c = np.meshgrid(np.arange(32), np.arange(32), indexing='ij')
    ramp = np.stack([r * 6 + 30, c * 6 + 30, np.full_like(r, 128)], -1).astype(np.uint8)[None].repeat(8, 0)
    X = np.c_[r[6:-6, 6:-6].ravel(), c[6:-6, 6:-6].ravel(), np.ones(400)]
    rms = []
    for s in range(1, 6):
        y = hwc(corrupt(chw(ramp), 'elastic_transform', s))[:, 6:-6, 6:-6, :2].astype(float)
        src = ((y - 30) / 6).reshape(8, -1, 2)
        res = [p - X @ np.linalg.lstsq(X, p, rcond=None)[0] for p in src]
        rms.append(np.sqrt(np.mean(np.square(res))))
    assert rms[0] < .1 and all(a < b for a, b in zip(rms, rms[1:])), rms


# ---------------------------------------------------------------- each corruption against its reference definition
@pytest.mark.parametrize('severity', [1, 3, 5])
def test_gaussian_shot_speckle_noise_are_the_reference_formulas(severity, photos):
    x = hwc(photos[:3])
    for name in ('gaussian_noise', 'shot_noise', 'speckle_noise'):
        c = CORRUPTIONS[name]['constants'][severity - 1]
        ref = []
        for i, img in enumerate(x):
            u, r = img / 255., gen(name, severity, i)
            if name == 'gaussian_noise': y = u + r.normal(size=u.shape, scale=c)
            elif name == 'shot_noise': y = r.poisson(u * c) / c
            else: y = u + u * r.normal(size=u.shape, scale=c)
            ref.append(store(y))
        np.testing.assert_array_equal(hwc(corrupt(photos[:3], name, severity)), np.stack(ref), err_msg=name)


def test_noise_statistics_on_a_flat_image():
    x = torch.full((8, 3, 32, 32), 100, dtype=torch.uint8)
    u = 100 / 255
    for s in (1, 5):
        c = CORRUPTIONS['gaussian_noise']['constants'][s - 1]
        d = corrupt(x, 'gaussian_noise', s).double() / 255 - u
        assert abs(d.std().item() - c) < .03 * c
        c = CORRUPTIONS['shot_noise']['constants'][s - 1]
        d = corrupt(x, 'shot_noise', s).double() / 255 - u
        assert abs(d.var().item() - u / c) < .06 * u / c
        c = CORRUPTIONS['impulse_noise']['constants'][s - 1]
        y = corrupt(x, 'impulse_noise', s)
        n, hit = y.numel(), y != 100
        se = math.sqrt(c * (1 - c) / n)
        assert abs(hit.double().mean().item() - c) < 4 * se                 # each value flipped with probability c
        assert set(y[hit].unique().tolist()) <= {0, 255}                     # to pepper or salt
        assert abs((y == 255).double().mean().item() - c / 2) < 4 * math.sqrt(c / 2 / n)     # half of them salt


def _gaussian_loop(a: np.ndarray, sigma: float) -> np.ndarray:
    "Per-channel Gaussian blur written out: edge pixel repeated, radius int(4σ + .5) (skimage/scipy defaults)."
    r = int(4 * sigma + .5)
    t = np.arange(-r, r + 1)
    w = np.exp(-t ** 2 / (2 * sigma ** 2)); w /= w.sum()
    H, W, _ = a.shape
    out = np.zeros(a.shape)
    for i in range(H):
        for j in range(W):
            for di in range(-r, r + 1):
                for dj in range(-r, r + 1):
                    out[i, j] += w[di + r] * w[dj + r] * a[min(max(i + di, 0), H - 1), min(max(j + dj, 0), W - 1)]
    return out


@pytest.mark.parametrize('severity', [1, 5])
def test_gaussian_blur_against_a_written_out_convolution(severity, noise_images):
    x = hwc(noise_images[:2])                                       # sharp images: the border rule shows
    sigma = [.4, .6, .7, .8, 1][severity - 1]
    ref = np.stack([store(_gaussian_loop(a / 255., sigma)) for a in x])
    close_levels(hwc(corrupt(noise_images[:2], 'gaussian_blur', severity)), ref)


def _defocus_kernel(radius: float, alias: float) -> np.ndarray:
    "make_cifar_c's disk(): the 17x17 aliased disk, normalised, blurred by a 3x3 Gaussian (OpenCV's weights)."
    k = np.zeros((17, 17))
    for i in range(-8, 9):
        for j in range(-8, 9):
            k[i + 8, j + 8] = 1. if i * i + j * j <= radius * radius else 0.
    k /= k.sum()
    g = np.array([math.exp(-1 / (2 * alias ** 2)), 1., math.exp(-1 / (2 * alias ** 2))]); g /= g.sum()
    out = np.zeros_like(k)
    for i in range(1, 16):                          # the disk's support is far from the kernel's own border
        for j in range(1, 16):
            out[i, j] = sum(g[a] * g[b] * k[i + a - 1, j + b - 1] for a in range(3) for b in range(3))
    return out


@pytest.mark.parametrize('severity', [1, 4, 5])
def test_defocus_blur_against_a_written_out_filter(severity, photos):
    radius, alias = CORRUPTIONS['defocus_blur']['constants'][severity - 1]
    k = _defocus_kernel(radius, alias)
    x = hwc(photos[:2]) / 255.
    refl = lambda i, n: -i if i < 0 else 2 * (n - 1) - i if i > n - 1 else i      # BORDER_REFLECT_101
    ref = np.zeros_like(x)
    nz = np.argwhere(k > 0)
    for n in range(len(x)):
        for i in range(32):
            for j in range(32):
                ref[n, i, j] = sum(k[a, b] * x[n, refl(i + a - 8, 32), refl(j + b - 8, 32)] for a, b in nz)
    close_levels(hwc(corrupt(photos[:2], 'defocus_blur', severity)), store(ref))


def test_glass_blur_moves_pixels_from_their_up_left_neighbours(noise_images):
    "At severity 1 (σ .05: both blurs are the identity) every visited pixel copies itself or an up/left neighbour."
    x, y = hwc(noise_images), hwc(corrupt(noise_images, 'glass_blur', 1))
    visited = (slice(None), slice(2, 32), slice(2, 32))
    cands = np.stack([x[:, 2:, 2:], x[:, 1:-1, 2:], x[:, 2:, 1:-1], x[:, 1:-1, 1:-1]])
    assert (y[visited][None] == cands).all(-1).any(0).all()
    np.testing.assert_array_equal(y[:, :2], x[:, :2]); np.testing.assert_array_equal(y[:, :, :2], x[:, :, :2])
    moved = 1 - (y[visited] == x[visited]).all(-1).mean()
    assert .65 < moved < .8, moved                                    # 3 of the 4 offsets move a pixel


def _motion_loop(a: np.ndarray, radius: float, sigma: float, angle: float) -> np.ndarray:
    "ImageMagick's MotionBlurImage, written out: width 2 ceil(r) + 1, one-sided Gaussian, rounded offsets, edge pixels."
    width = 2 * math.ceil(radius) + 1
    k = [math.exp(-(i * i) / (2 * sigma * sigma)) for i in range(width)]
    k = [v / sum(k) for v in k]
    px, py = width * math.sin(math.radians(angle)), width * math.cos(math.radians(angle))
    off = [(math.ceil(i * py / math.hypot(px, py) - .5), math.ceil(i * px / math.hypot(px, py) - .5))
           for i in range(width)]                                           # (x, y) offsets
    H, W, _ = a.shape
    out = np.zeros(a.shape)
    for y in range(H):
        for x in range(W):
            for w, (ox, oy) in zip(k, off):
                out[y, x] += w * a[min(max(y + oy, 0), H - 1), min(max(x + ox, 0), W - 1)]
    return np.clip(np.floor(out + .5), 0, 255).astype(np.uint8)


def test_motion_blur_is_imagemagicks_line(photos):
    a = hwc(photos[:1])
    for (radius, sigma), angle in zip(CORRUPTIONS['motion_blur']['constants'], (0, 30, -45, 90, -17.5)):
        ours = motion_blur_images(a.astype(np.float64), radius, sigma, [angle])[0]
        close_levels(ours, _motion_loop(a[0].astype(np.float64), radius, sigma, angle), exact=.995)


def test_motion_blur_angles_are_in_the_reference_range():
    "A bright dot is smeared back along the line: the smear's direction gives the angle, which must lie in [-45, 45]."
    x = torch.zeros(24, 3, 33, 33, dtype=torch.uint8); x[:, :, 16, 16] = 255
    y = corrupt(x, 'motion_blur', 5)[:, 0].double()
    rows, cols = torch.meshgrid(torch.arange(33.), torch.arange(33.), indexing='ij')
    mx = ((y * cols).sum((1, 2)) / y.sum((1, 2)) - 16).numpy()
    my = ((y * rows).sum((1, 2)) / y.sum((1, 2)) - 16).numpy()
    angles = np.degrees(np.arctan2(-my, -mx))                            # the line points opposite to the smear
    assert (np.abs(angles) <= 47).all() and np.ptp(angles) > 40, angles


@pytest.mark.parametrize('severity', [1, 5])
def test_zoom_blur_against_scipy_zoom(severity, photos):
    x = hwc(photos[:2]) / 255.
    zs = np.arange(1, [1.06, 1.11, 1.16, 1.21, 1.26][severity - 1], .01)
    assert len(zs) == [7, 12, 16, 21, 26][severity - 1]              # numpy's float arange, as the reference runs it
    ref = []
    for img in x.astype(np.float32):
        out = np.zeros_like(img)
        for z in zs:
            ch = int(np.ceil(32 / z)); top = (32 - ch) // 2
            zi = ndimage.zoom(img[top:top + ch, top:top + ch], (z, z, 1), order=1)
            t = (zi.shape[0] - 32) // 2
            out += zi[t:t + 32, t:t + 32]
        ref.append(store((img + out) / (len(zs) + 1)))
    close_levels(hwc(corrupt(photos[:2], 'zoom_blur', severity)), np.stack(ref))


@pytest.mark.parametrize('severity', [1, 3, 5])
def test_snow_is_symmetric_and_never_darker_than_the_paled_image(severity):
    "On a flat image the snow layer (added with its 180° turn) is symmetric, on top of k u + (1 - k) max(u, 1.5 g + .5)."
    keep = CORRUPTIONS['snow']['constants'][severity - 1][6]
    x = torch.full((4, 3, 32, 32), 50, dtype=torch.uint8)
    y = hwc(corrupt(x, 'snow', severity))
    np.testing.assert_array_equal(y, np.rot90(y, 2, axes=(1, 2)))
    u = 50 / 255
    base = int(255 * (keep * u + (1 - keep) * max(u, 1.5 * u + .5)))
    assert y.min() >= base - 1 and (y > base + 5).any()


def test_frost_blends_a_random_crop_of_one_of_five_photographs(tmp_path):
    "Stand-in photographs, non-zero only on the pixels (5j + 2, 5l + 2) OpenCV's 0.2x resize samples, with unique windows."
    shrunk = []
    for k, f in enumerate(FROST_FILES):
        j, l = np.meshgrid(np.arange(40), np.arange(52), indexing='ij')
        S = np.stack([(7 * j + 3 * l + 40 * k) % 256, (5 * j * l + k) % 256, np.full_like(j, 10 * k)], -1).astype(np.uint8)
        a = np.zeros((200, 260, 3), np.uint8); a[2::5, 2::5] = S
        Image.fromarray(a).save(tmp_path / f, format='PNG')
        shrunk.append(S)
    x = torch.randint(0, 256, (12, 3, 32, 32), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    for s in (1, 5):
        w_img, w_frost = CORRUPTIONS['frost']['constants'][s - 1]
        y, xs = hwc(corrupt(x, 'frost', s, frost_dir=tmp_path)), hwc(x).astype(np.float64)
        used = []
        for n in range(len(xs)):
            hits = [(k, i, j) for k in range(5) for i in range(40 - 32 + 1) for j in range(52 - 32 + 1)
                    if (y[n] == np.clip(w_img * xs[n] + w_frost * shrunk[k][i:i + 32, j:j + 32], 0, 255)
                        .astype(np.uint8)).all()]
            assert len(hits) == 1, (s, n, hits)
            used.append(hits[0])
        assert len({k for k, _, _ in used}) > 1 and len({(i, j) for _, i, j in used}) > 1
        assert all(i < 40 - 32 and j < 52 - 32 for _, i, j in used)         # randint(0, size - 32) excludes its end
    assert len(cifar_c_shifts()) == (75 if default_frost_dir() else 70) and len(cifar_c_shifts(frost_dir=tmp_path)) == 75
    key, before = Corruption('frost', 2, frost_dir=tmp_path).key(), corrupt(x, 'frost', 2, frost_dir=tmp_path)
    Image.fromarray(np.full((200, 260, 3), 9, np.uint8)).save(tmp_path / FROST_FILES[0], format='PNG')
    assert Corruption('frost', 2, frost_dir=tmp_path).key() != key           # other photographs, other cached set
    assert not torch.equal(corrupt(x, 'frost', 2, frost_dir=tmp_path), before)   # and they are read again
    (tmp_path / FROST_FILES[4]).unlink()
    with pytest.raises(FileNotFoundError, match='frost5.jpg'): corrupt(x, 'frost', 1, frost_dir=tmp_path)


@pytest.mark.parametrize('severity', [1, 5])
def test_fog_spans_the_reference_range_on_a_flat_image(severity):
    "P spans [0, 1] exactly, so (v + sP) v / (v + s) spans [v^2 / (v + s), v]."
    s = CORRUPTIONS['fog']['constants'][severity - 1][0]
    y = corrupt(torch.full((3, 3, 32, 32), 170, dtype=torch.uint8), 'fog', severity)
    v = 170 / 255
    for img in y:
        assert abs(int(img.max()) - int(255 * v)) <= 1 and abs(int(img.min()) - int(255 * v * v / (v + s))) <= 1


def _hsv_reference(x: np.ndarray, channel: int, f) -> np.ndarray:
    out = np.zeros(x.shape)
    for idx in np.ndindex(x.shape[:-1]):
        hsv = list(colorsys.rgb_to_hsv(*(x[idx] / 255.)))
        hsv[channel] = min(max(f(hsv[channel]), 0.), 1.)
        out[idx] = colorsys.hsv_to_rgb(*hsv)
    return store(out)


@pytest.mark.parametrize('severity', [1, 3, 5])
def test_brightness_and_saturate_against_colorsys(severity, photos):
    x = hwc(photos[:2])
    c = CORRUPTIONS['brightness']['constants'][severity - 1]
    close_levels(hwc(corrupt(photos[:2], 'brightness', severity)), _hsv_reference(x, 2, lambda v: v + c))
    a, b = CORRUPTIONS['saturate']['constants'][severity - 1]
    # at factor 1.5 the smallest channel, v (1 - 1.5 s) = 1.5 min - .5 max, lands exactly on a level for about half the
    # pixels, where a 1e-14 difference in the float path decides the truncation: one level, on a few percent of values
    close_levels(hwc(corrupt(photos[:2], 'saturate', severity)), _hsv_reference(x, 1, lambda s: s * a + b), exact=.95)


def test_hsv_conversions_against_colorsys():
    u = np.random.default_rng(0).integers(0, 256, (500, 3)) / 255.
    u[:5] = [[0, 0, 0], [1, 1, 1], [.5, .5, .2], [.2, .5, .5], [.5, .2, .5]]          # black, white, ties
    from pe_anchors.corruptions import rgb_to_hsv, hsv_to_rgb
    np.testing.assert_allclose(rgb_to_hsv(u), [colorsys.rgb_to_hsv(*p) for p in u], atol=1e-12)
    hsv = np.random.default_rng(1).random((500, 3))
    np.testing.assert_allclose(hsv_to_rgb(hsv), [colorsys.hsv_to_rgb(*p) for p in hsv], atol=1e-12)


def test_contrast_is_the_reference_formula(photos):
    x = hwc(photos) / 255.
    for s, c in enumerate([.75, .5, .4, .3, .15], 1):
        m = x.mean(axis=(1, 2), keepdims=True)
        np.testing.assert_array_equal(hwc(corrupt(photos, 'contrast', s)), store((x - m) * c + m))


def _pil_box(a: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    "PIL's BOX resampling written out: pixels whose centres fall in the footprint, averaged; horizontal pass first."
    def weights(n_in, n_out):
        scale = n_in / n_out
        fs = max(scale, 1.)
        M = np.zeros((n_out, n_in))
        for j in range(n_out):
            centre = (j + .5) * scale
            lo, hi = max(int(centre - .5 * fs + .5), 0), min(int(centre + .5 * fs + .5), n_in)
            for k in range(lo, hi):
                t = (k - centre + .5) / fs
                M[j, k] = 1. if -.5 < t <= .5 else 0.
            M[j] /= M[j].sum()
        return M
    Mw, Mh = weights(a.shape[1], size[0]), weights(a.shape[0], size[1])
    y = np.floor(np.einsum('wk,hkc->hwc', Mw, a.astype(float)) + .5)         # horizontal, rounded to 8 bits
    return np.floor(np.einsum('hk,kwc->hwc', Mh, y) + .5).astype(np.uint8)


def test_pixelate_is_pils_box_resampling_there_and_back(photos):
    x = hwc(photos[:3])
    for s, c in enumerate([.95, .9, .85, .75, .65], 1):
        small = (int(32 * c), int(32 * c))
        ref = np.stack([_pil_box(_pil_box(a, small), (32, 32)) for a in x])
        close_levels(hwc(corrupt(photos[:3], 'pixelate', s)), ref, exact=.98)


def test_jpeg_is_pil_at_the_cifar_qualities(photos):
    x = hwc(photos)
    for s, q in enumerate([80, 65, 58, 50, 40], 1):
        ref = []
        for a in x:
            buf = io.BytesIO(); Image.fromarray(a).save(buf, 'JPEG', quality=q); buf.seek(0)
            ref.append(np.asarray(Image.open(buf).convert('RGB')))
        np.testing.assert_array_equal(hwc(corrupt(photos, 'jpeg_compression', s)), np.stack(ref))


def test_elastic_severity1_is_the_reference_affine_warp(photos):
    "α = 0 at severity 1: the output is OpenCV's warpAffine of the three jittered points, written out (bilinear, reflect-101)."
    jitter = 32 * .08
    x = hwc(photos[:2]).astype(np.float32) / 255
    refl = lambda i, n: -i if i < 0 else 2 * (n - 1) - i if i > n - 1 else i
    ref = np.zeros_like(x)
    for n in range(len(x)):
        pts1 = np.float32([[26, 26], [26, 6], [6, 6]])                  # centre 16 ± 32 // 3, as (x, y)
        pts2 = pts1 + gen('elastic_transform', 1, n).uniform(-jitter, jitter, size=(3, 2)).astype(np.float32)
        # the affine map M with M [x, y, 1] = pts2 for pts1, inverted: where each output pixel reads
        M = np.linalg.solve(np.c_[pts1, np.ones(3)].astype(np.float64), pts2.astype(np.float64)).T
        Minv = np.linalg.inv(np.vstack([M, [0, 0, 1]]))
        for i in range(32):
            for j in range(32):
                sx, sy, _ = Minv @ [j, i, 1]
                x0, y0 = math.floor(sx), math.floor(sy)
                fx, fy = sx - x0, sy - y0
                v = 0
                for dy, wy in ((0, 1 - fy), (1, fy)):
                    for dx, wx in ((0, 1 - fx), (1, fx)):
                        v = v + wy * wx * x[n, refl(y0 + dy, 32), refl(x0 + dx, 32)]
                ref[n, i, j] = v
    close_levels(hwc(corrupt(photos[:2], 'elastic_transform', 1)), store(ref))


# ---------------------------------------------------------------- as shifts
class Stripes(nn.Module):
    "Predicts which third of the image (left, middle, right) is brightest."
    def __init__(self): super().__init__(); self.dummy = nn.Parameter(torch.zeros(()))
    def forward(self, x): return torch.stack([c.mean((1, 2, 3)) for c in x.chunk(3, dim=-1)], -1) + self.dummy


def test_corruption_shifts_with_shifted_sets_and_evaluate_shifts(tmp_path):
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 256, (40, 3, 32, 32), dtype=torch.uint8, generator=g)
    y = torch.stack([c.float().mean((1, 2, 3)) for c in x.chunk(3, dim=-1)], -1).argmax(-1)
    shifts = cifar_c_shifts(['impulse_noise', 'brightness'], (2, 4))
    assert [s.name for s in shifts] == ['impulse_noise/s2', 'impulse_noise/s4', 'brightness/s2', 'brightness/s4']
    sets = ShiftedSets(TensorBatches(x, y, 16), cache_dir=tmp_path, dataset_id='toy-32')
    res = evaluate_shifts({('stripes', 0): Stripes()}, sets, shifts, normalize=((0,) * 3, (1 / 255,) * 3))
    assert len(list(tmp_path.iterdir())) == 4
    torch.testing.assert_close(sets[shifts[0]].images, corrupt(x, 'impulse_noise', 2), rtol=0, atol=0)
    rows = res[res['shift'] != 'clean']
    assert rows.kind.tolist() == ['impulse_noise', 'impulse_noise', 'brightness', 'brightness']
    assert rows.level.tolist() == [2., 4., 2., 4.]
    np.testing.assert_allclose(rows.fs, 1 - rows.acc / rows.acc_clean)
    again = ShiftedSets(TensorBatches(x, y, 16), cache_dir=tmp_path, dataset_id='toy-32')
    assert torch.equal(again[shifts[3]].images, sets[shifts[3]].images)       # read back from the cache
    assert Corruption('contrast', 2, seed=0).key() == Corruption('contrast', 2, seed=3).key()
    assert Corruption('fog', 2, seed=0).key() != Corruption('fog', 2, seed=3).key()


@pytest.mark.skipif(default_frost_dir() is None, reason=f"frost's photographs are not installed: {FROST_INSTALL}")
def test_frost_falls_by_the_constants_where_it_does(photos):
    "Severities 3 and 4 blend the same photograph weight (.4) into less of the image (.9, .85): the darker image offsets the frost."
    p = [psnr_np(corrupt(photos, 'frost', s), photos).mean() for s in range(1, 6)]
    assert p[0] > p[1] > p[2] and p[3] > p[4] and p[2] < p[3], p
    x = hwc(photos).astype(np.float64)
    F = np.full_like(x, 200.)                                                  # one bright frost crop for both severities
    err = [np.mean(((a - 1) * x + b * F) ** 2) for a, b in CORRUPTIONS['frost']['constants'][2:4]]
    assert err[1] < err[0]


class GlobalDraws:
    "A per-image generator drawing from numpy's global one, in the reference's order."
    def integers(self, low, high=None): return np.random.randint(low, high)


def imagecorruptions_frost(constants):
    "imagecorruptions' own frost, its constant table replaced by `constants`, its photograph fit by CIFAR-10-C's 0.2x shrink."
    cv2 = pytest.importorskip('cv2')
    if 'pkg_resources' not in sys.modules:             # imagecorruptions 1.1.2 imports it; setuptools >= 81 no longer ships it
        shim = types.ModuleType('pkg_resources')
        shim.resource_filename = lambda pkg, p: os.path.join(os.path.dirname(sys.modules[pkg].__file__), p)
        sys.modules['pkg_resources'] = shim
    icc = pytest.importorskip('imagecorruptions.corruptions')
    code = icc.frost.__code__
    table = ((1, .4), (.8, .6), (.7, .7), (.65, .7), (.6, .75))               # ImageNet-C's, as the package has them
    assert table in code.co_consts
    consts = tuple(tuple(constants) if k == table else k for k in code.co_consts)
    shrink = types.SimpleNamespace(imread=cv2.imread, INTER_CUBIC=cv2.INTER_CUBIC,
                                   resize=lambda img, dsize, interpolation: cv2.resize(img, (0, 0), fx=.2, fy=.2))
    return types.FunctionType(code.replace(co_consts=consts), {**icc.frost.__globals__, 'cv2': shrink})


@pytest.mark.skipif(default_frost_dir() is None, reason=f"frost's photographs are not installed: {FROST_INSTALL}")
def test_frost_is_imagecorruptions_own_at_the_cifar10c_constants(photos):
    "Same pixels as the package's frost run with CIFAR-10-C's constants and shrink, the draws from one global generator."
    ref = imagecorruptions_frost(CORRUPTIONS['frost']['constants'])
    x, used = hwc(photos), set()
    for s in range(1, 6):
        for n in range(len(x)):
            np.random.seed(10 * s + n); want = np.uint8(ref(x[n], s))
            np.random.seed(10 * s + n); used.add(np.random.randint(5))
            np.random.seed(10 * s + n); got = frost(x[n:n + 1], CORRUPTIONS['frost']['constants'][s - 1], [GlobalDraws()])[0]
            np.testing.assert_array_equal(got, want)
    assert used == set(range(5))                                              # all five photographs, JPEG ones included
    assert [f.name for f in sorted(default_frost_dir().glob('frost[1-5].*'))] == list(FROST_FILES)
