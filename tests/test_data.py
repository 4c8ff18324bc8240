"""pe_anchors.data: dataset builders, device-side augmentation, the uint8 evaluation stream."""
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from fastai.torch_core import set_seed
from PIL import Image

import pe_anchors.data as D
import pe_anchors.loaders as loaders
from pe_anchors.core import IMAGENET_MEAN
from pe_anchors.data import (IMAGENET100_WNIDS, ImageSplit, BatchAug, translate_flip, resized_crop, random_boxes,
                             digits, image_folder, imagenet100, cifar10, get_data)
import dataclasses, shutil
from pe_anchors.data import decode_file


def test_cmc_list():
    assert len(IMAGENET100_WNIDS) == len(set(IMAGENET100_WNIDS)) == 100
    assert all(w.startswith('n') and len(w) == 9 for w in IMAGENET100_WNIDS)
    # a few positions of the CMC file order
    assert IMAGENET100_WNIDS[0] == 'n02869837' and IMAGENET100_WNIDS[10] == 'n01735189'
    assert IMAGENET100_WNIDS[50] == 'n02259212' and IMAGENET100_WNIDS[99] == 'n02090622'


def _brute_translate_flip(x, shifts, flips, pad):
    B, C, H, W = x.shape
    out = torch.zeros_like(x)
    for b in range(B):
        dy, dx = shifts[b].tolist()
        for i in range(H):
            for j in range(W):
                jj = W - 1 - j if flips[b] else j          # mirror the output column
                si, sj = i + dy, jj + dx                   # source pixel in the unpadded image
                if 0 <= si < H and 0 <= sj < W: out[b, :, i, j] = x[b, :, si, sj]
    return out


def test_translate_flip_matches_brute_force():
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (6, 3, 7, 7), generator=g, dtype=torch.uint8)
    shifts = torch.randint(-3, 4, (6, 2), generator=g)
    flips = torch.rand(6, generator=g) < .5
    got = translate_flip(x, shifts, flips, pad=3)
    assert got.dtype == torch.uint8
    assert torch.equal(got, _brute_translate_flip(x, shifts, flips, 3))


def test_resized_crop_identity_flip_and_downscale():
    x = torch.rand(3, 3, 8, 8)
    full = torch.tensor([[0., 0., 1., 1.]] * 3)
    no, yes = torch.zeros(3, dtype=torch.bool), torch.ones(3, dtype=torch.bool)
    torch.testing.assert_close(resized_crop(x, full, no, 8), x)
    torch.testing.assert_close(resized_crop(x, full, yes, 8), x.flip(-1))
    # half resolution samples exactly between pixel centres: bilinear = mean of each 2x2 block
    torch.testing.assert_close(resized_crop(x, full, no, 4), F.avg_pool2d(x, 2))
    # the top-left quadrant box sampled at 4x4 hits exactly the quadrant's pixel centres
    tl = torch.tensor([[-.5, -.5, .5, .5]] * 3)
    torch.testing.assert_close(resized_crop(x, tl, no, 4), x[..., :4, :4])


def test_random_boxes_inside_image():
    torch.manual_seed(0)
    b = random_boxes(2000, scale=(0.08, 1.), ratio=(3 / 4, 4 / 3))
    cx, cy, w, h = b.unbind(1)
    assert (cx.abs() + w <= 1 + 1e-6).all() and (cy.abs() + h <= 1 + 1e-6).all()
    area = w * h
    assert area.max() <= 1 + 1e-6 and area.min() >= 0.08 * 0.99 * 0.75   # clipping only shrinks tall/wide boxes


def test_batchaug_normalisation_formula_and_determinism():
    mean, std = (0.1, 0.2, 0.3), (0.5, 0.4, 0.25)
    x = torch.randint(0, 256, (4, 3, 6, 6), dtype=torch.uint8)
    y = torch.arange(4)
    xn, yn = BatchAug(6, mean, std)((x, y))
    ref = (x.float() / 255 - torch.tensor(mean)[:, None, None]) / torch.tensor(std)[:, None, None]
    torch.testing.assert_close(xn, ref)
    assert torch.equal(yn, y)
    a = BatchAug(6, mean, std, aug='rrc_flip')
    torch.manual_seed(3); r1 = a((x, y))[0]
    torch.manual_seed(3); r2 = a((x, y))[0]
    assert torch.equal(r1, r2) and not torch.allclose(r1, xn)


def test_mixup_gives_soft_targets():
    a = BatchAug(6, (0.5,) * 3, (0.5,) * 3, aug='flip', mixup=dict(num_classes=5, mixup_alpha=.8, cutmix_alpha=1.,
                                                                    label_smoothing=.1))
    x = torch.randint(0, 256, (8, 3, 6, 6), dtype=torch.uint8)
    _, y = a((x, torch.arange(8) % 5))
    assert y.shape == (8, 5) and torch.allclose(y.sum(1), torch.ones(8))


def test_digits_values_and_split():
    from sklearn.datasets import load_digits
    d = digits(img_size=8)
    ref = load_digits()
    assert (len(d.train), len(d.valid)) == (1437, 360) and d.img_size == 8 and d.c == 10
    x = torch.cat([d.train.images, d.valid.images]); y = torch.cat([d.train.labels, d.valid.labels])
    assert x.dtype == torch.uint8 and x.shape[1:] == (3, 8, 8)
    assert torch.equal(x[:, 0], x[:, 2])
    # the images are the bundled ones, 0..16 scaled to 0..255: check against sklearn one by one (as a multiset)
    want = sorted((tuple((np.round(im * 255 / 16)).astype(int).ravel()), int(t)) for im, t in zip(ref.images, ref.target))
    got = sorted((tuple(im[0].ravel().tolist()), int(t)) for im, t in zip(x, y))
    assert got == want
    assert torch.equal(digits().valid.labels, d.valid.labels)                 # fixed (and the same at any size)
    assert not torch.equal(digits(seed=1).valid.labels, d.valid.labels)       # seeded
    # the 16 px default is the bilinear upsampling (align_corners=False) of the unrounded 8 px values: upsampling the
    # rounded 8 px images instead differs by at most one grey level (a convex combination of values off by <= .5)
    up = torch.nn.functional.interpolate(d.valid.images[:, :1].float(), size=16, mode='bilinear', align_corners=False)
    d16 = digits()
    assert d16.img_size == 16 and d16.valid.images.shape[1:] == (3, 16, 16)
    assert (d16.valid.images[:, :1].float() - up).abs().max() <= 1.
    counts = torch.bincount(d.valid.labels, minlength=10)
    assert counts.min() >= 34 and counts.max() <= 38                          # stratified (20% of ~180 per class)


def test_dls_batches_and_seeded_shuffle():
    d = digits()
    set_seed(1); b1 = d.dls(bs=32, device='cpu').one_batch()
    set_seed(1); b2 = d.dls(bs=32, device='cpu').one_batch()
    set_seed(2); b3 = d.dls(bs=32, device='cpu').one_batch()
    assert torch.equal(b1[0], b2[0]) and torch.equal(b1[1], b2[1]) and not torch.equal(b1[1], b3[1])
    x, y = b1
    assert x.dtype == torch.float32 and x.shape == (32, 3, 16, 16) and y.dtype == torch.long
    dls = d.dls(bs=32, device='cpu')
    assert len(dls.train) == 1437 // 32 and len(dls.valid) == -(-360 // 64)
    assert sum(len(yb) for _, yb in dls.valid) == 360


def test_valid_uint8_contract():
    d = digits()
    batches = list(d.valid_uint8(bs=100, device='cpu'))
    assert [len(y) for _, y in batches] == [100, 100, 100, 60]               # all images, last partial batch kept
    x = torch.cat([b[0] for b in batches]); y = torch.cat([b[1] for b in batches])
    assert x.dtype == torch.uint8 and x.shape == (360, 3, 16, 16) and y.dtype == torch.long
    assert torch.equal(x, d.valid.images) and torch.equal(y, d.valid.labels)  # dataset order, unaugmented
    xv = torch.cat([xb for xb, _ in d.dls(bs=50, device='cpu').valid])
    torch.testing.assert_close(d.normalize(x), xv, rtol=0, atol=0)
    ref = (x.float() / 255 - torch.tensor(d.mean)[:, None, None]) / torch.tensor(d.std)[:, None, None]
    torch.testing.assert_close(d.normalize(x), ref)


def test_training_loader_shards_across_ranks(monkeypatch):
    d = digits()
    seen = []
    for r in range(2):
        monkeypatch.setattr(loaders, 'dist_info', lambda r=r: (r, 2))
        set_seed(0)
        dl = d.dls(bs=16, device='cpu', aug='none').train
        idx = dl.get_idxs()
        assert len(dl) == (1437 // 2) // 16 and len(idx) == 1437 // 2
        seen.append(set(idx))
    assert not seen[0] & seen[1] and len(seen[0] | seen[1]) == 2 * (1437 // 2)


def _make_folder(root: Path, classes, n=3, size=(12, 10), split_names=('train', 'val')):
    for split in split_names:
        for ci, c in enumerate(classes):
            (root / split / c).mkdir(parents=True, exist_ok=True)
            for i in range(n):
                Image.new('RGB', size, (20 * i, 10 * ci % 256, 200)).save(root / split / c / f'{i}.png')


@pytest.mark.parametrize('in_memory', [False, True])
def test_image_folder_skips_corrupt_file(tmp_path, caplog, in_memory):
    _make_folder(tmp_path, ['cat', 'dog'])
    (tmp_path / 'train' / 'dog' / 'broken.jpg').write_bytes(b'\xff\xd8garbage')
    with caplog.at_level(logging.WARNING, logger='pe_anchors.data'):
        data = image_folder(tmp_path, img_size=8, in_memory=in_memory)
    assert len(data.train) == 6 and len(data.valid) == 6 and data.classes == ['cat', 'dog']
    assert any('skipped 1 unreadable' in r.message for r in caplog.records)
    x, y = next(data.valid_uint8(bs=6, device='cpu', num_workers=0))
    assert x.shape == (6, 3, 8, 8) and x.dtype == torch.uint8 and y.tolist() == [0, 0, 0, 1, 1, 1]
    xb, yb = data.dls(bs=4, device='cpu', num_workers=0).one_batch()
    assert xb.shape == (4, 3, 8, 8) and xb.dtype == torch.float32


def test_file_and_memory_paths_agree(tmp_path):
    _make_folder(tmp_path, ['a', 'b'], split_names=('train', 'test'))
    files = image_folder(tmp_path, img_size=8, in_memory=False)
    mem = image_folder(tmp_path, img_size=8, in_memory=True)
    xf = torch.cat([x for x, _ in files.valid_uint8(bs=4, device='cpu', num_workers=0)])
    assert torch.equal(xf, mem.valid.images)


def test_missing_paths_show_layout(tmp_path):
    with pytest.raises(FileNotFoundError, match=r'train/<class>'): image_folder(tmp_path / 'nope')
    (tmp_path / 'train' / 'a').mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match='val/, valid/ or test/'): image_folder(tmp_path)
    with pytest.raises(ValueError, match='download=True'): cifar10()
    with pytest.raises(ValueError, match='unknown dataset'): get_data('no_such_dataset_here')


def test_imagenet100_from_imagenet1k_folder(tmp_path):
    _make_folder(tmp_path, list(IMAGENET100_WNIDS) + ['n99999999'], n=1, size=(6, 5))
    data = imagenet100(tmp_path, img_size=16)
    assert data.c == 100 and data.classes == sorted(IMAGENET100_WNIDS) and len(data.train) == 100
    assert data.mean == IMAGENET_MEAN and data.default_aug == 'rrc_flip'
    x, y = next(data.valid_uint8(bs=100, device='cpu', num_workers=0))
    assert x.shape == (100, 3, 16, 16) and torch.equal(y, torch.arange(100))
    xb, _ = data.dls(bs=10, device='cpu', num_workers=0).one_batch()   # random-resized-crop in the loader
    assert xb.shape == (10, 3, 16, 16)
    import shutil
    shutil.rmtree(tmp_path / 'val' / IMAGENET100_WNIDS[7]); shutil.rmtree(tmp_path / 'val' / IMAGENET100_WNIDS[42])
    with pytest.raises(FileNotFoundError, match=f'lacks 2 .*{IMAGENET100_WNIDS[7]} {IMAGENET100_WNIDS[42]}'):
        imagenet100(tmp_path)


def test_cifar_npz_matches_folder(cifar_npz, cifar_dir):
    data = cifar10(cifar_npz)
    assert (len(data.train), len(data.valid)) == (50000, 10000) and data.classes == list(D.CIFAR10_CLASSES)
    with np.load(cifar_npz) as d: labels = d['val_labels']
    assert torch.equal(data.valid.labels, torch.from_numpy(labels.astype(np.int64)))
    ref = D.decode_file(cifar_dir / 'val' / 'cat' / '0000.jpg')           # same JPEG bytes, same decoder
    i = int((data.valid.labels == 3).nonzero()[0])
    assert torch.equal(data.valid.images[i], ref)
    m = data.train.images.float().mean((0, 2, 3))
    torch.testing.assert_close(m, torch.tensor([125.27, 122.94, 113.86]), atol=0.05, rtol=0)


@pytest.mark.cuda
def test_in_memory_batches_stay_on_the_gpu():
    d = digits()
    dls = d.dls(bs=32, device='cuda')
    assert dls.train.dataset.images.is_cuda                                   # stored once on the device
    x, y = dls.one_batch()
    assert x.is_cuda and y.is_cuda and x.dtype == torch.float32
    xu, yu = next(d.valid_uint8(bs=50, device='cuda'))
    assert xu.is_cuda and xu.dtype == torch.uint8
    torch.testing.assert_close(d.normalize(xu).cpu(), d.normalize(xu.cpu()))


def _folder(root: Path, classes, n=2, splits=('train', 'val')):
    from PIL import Image
    for s in splits:
        for ci, c in enumerate(classes):
            (root / s / c).mkdir(parents=True, exist_ok=True)
            for i in range(n): Image.new('RGB', (10, 10), (30 * i, 40 * ci, 90)).save(root / s / c / f'{i}.png')


def test_out_of_range_labels_are_refused_at_load(small, tmp_path):
    with pytest.raises(ValueError, match=r'valid labels .*12.*outside 0\.\.9'):
        dataclasses.replace(small, valid=ImageSplit(torch.full((4,), 12), images=small.valid.images[:4]))
    with pytest.raises(ValueError, match=r'train labels .*-1'):
        dataclasses.replace(small, train=ImageSplit(torch.full((4,), -1), images=small.train.images[:4]))
    from torchvision.io import encode_jpeg
    jpg = [encode_jpeg(small.train.images[i]).numpy() for i in range(6)]
    off = np.cumsum([0] + [len(j) for j in jpg])
    np.savez(tmp_path / 'c.npz', train_jpeg=np.concatenate(jpg), train_offsets=off, train_labels=np.array([0, 1, 2, 3, 4, 10]),
             val_jpeg=np.concatenate(jpg), val_offsets=off, val_labels=np.arange(6), classes=np.array([str(i) for i in range(10)]))
    with pytest.raises(ValueError, match=r'train labels .*10.*outside 0\.\.9'): cifar10(tmp_path / 'c.npz')


@pytest.mark.parametrize('in_memory', [True, False])
def test_a_16_bit_png_loads(tmp_path, in_memory):
    from PIL import Image
    _folder(tmp_path, ['a', 'b'])
    v = (np.arange(100, dtype=np.uint16).reshape(10, 10) * 650)                 # 0..64350 over the 16-bit range
    deep = tmp_path / 'train' / 'b' / 'deep.png'
    Image.fromarray(v).save(deep)
    assert Image.open(deep).mode == 'I;16'
    want = torch.from_numpy(np.round(v / 257.).astype(np.uint8))                # 65535 -> 255
    x = decode_file(deep)
    assert x.dtype == torch.uint8 and x.shape == (3, 10, 10) and all(torch.equal(x[c], want) for c in range(3))
    data = image_folder(tmp_path, img_size=10, in_memory=in_memory)
    assert len(data.train) == 5
    if in_memory: got, label = data.train.images[4], data.train.labels[4]    # a/0, a/1, b/0, b/1, b/deep
    else: got, label = data.dls(bs=5, device='cpu', num_workers=0, aug='none').train.dataset[data.train.files.index(str(deep))]
    assert torch.equal(got[0], want) and int(label) == 1


def test_an_undecodable_image_names_its_file(tmp_path):
    (tmp_path / 'x.png').write_bytes(b'\x89PNG\r\n\x1a\nbroken')
    with pytest.raises(ValueError, match=r'x\.png'): decode_file(tmp_path / 'x.png')


def test_an_empty_or_missing_class_folder_is_named(tmp_path):
    _folder(tmp_path, ['cat', 'dog', 'eel'])
    for f in (tmp_path / 'train' / 'dog').iterdir(): f.unlink()
    with pytest.raises(ValueError, match=r"train.*'dog'.*no image"): image_folder(tmp_path, img_size=8)
    _folder(tmp_path, ['dog'], splits=('train',))
    shutil.rmtree(tmp_path / 'val' / 'eel')
    with pytest.raises(ValueError, match=r"'eel'.*no folder in .*val"): image_folder(tmp_path, img_size=8)
    (tmp_path / 'val' / 'eel').mkdir()
    with pytest.raises(ValueError, match=r"val.*'eel'.*no image"): image_folder(tmp_path, img_size=8, in_memory=False)


def test_an_animated_gif_in_an_image_folder_is_skipped_and_named(tmp_path, caplog):
    from PIL import Image
    from pe_anchors.data import decode_file, image_folder
    for split in ('train', 'val'):
        for c in ('a', 'b'):
            (tmp_path / split / c).mkdir(parents=True)
            for i in range(2): Image.new('RGB', (8, 8), (60 * i, 0, 0)).save(tmp_path / split / c / f'{i}.png')
    frames = [Image.new('RGB', (8, 8), (0, 0, 40 * k)) for k in range(3)]
    gif = tmp_path / 'train' / 'a' / 'anim.gif'
    frames[0].save(gif, save_all=True, append_images=frames[1:], duration=100, loop=0)
    with pytest.raises(ValueError, match=r'anim.gif is animated \(3 frames\)'): decode_file(gif, 8)
    for in_memory in (True, False):
        with caplog.at_level('WARNING', logger='pe_anchors.data'):
            d = image_folder(tmp_path, img_size=8, in_memory=in_memory)
        assert len(d.train) == 4 and 'anim.gif' in caplog.text, caplog.text     # the four still images, the GIF named
        assert not in_memory or 'is animated (3 frames)' in caplog.text, caplog.text     # decoded: and why
        caplog.clear()
