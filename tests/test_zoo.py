"""The atlas on timm's zoo (pe_anchors.atlas, pe_anchors.anatomy, pe_anchors.hooks): every architecture of `ZOO`, built
at random initialisation on a small input, is measured unpermuted and under RPI, or refused with a one-line reason.

References written out here, independently of the reader: each map's SSDC is scipy's Spearman correlation between the
image-averaged cosine similarities and minus the Manhattan distance, on timm's own `forward_intermediates` maps pooled
by 2 x 2 (k x k) cell means where the grid rule says so; an RPI entry's permuted output is the unpermuted output with its
tokens moved by the permutation, indexed by hand for each layout; and where nothing local lies between the entry and the
first map, the first map under RPI is the permuted unpermuted map when the position is zeroed, and is not otherwise.
"""
import re
import warnings

import numpy as np
import pytest
import timm
import torch
import torch.nn.functional as F
from scipy.stats import spearmanr

import pe_anchors  # noqa: F401  (registers the pe_vit_* models)
from pe_anchors.anatomy import anatomy, rpi_entries, rpi_reason, timm_model, zoo_family
from pe_anchors.atlas import MIN_STRIDE, MIN_TOKENS, ZOO, block_ssdc, coverage
from pe_anchors.hooks import TokenPermutation
from pe_anchors.interventions import measure_ssdc

# what each family must be: RPI measured, or refused (the reason's start); an independent statement, not read from the code
REFUSED = {'twins_pcpvt_small': 'position comes only from convolutions', 'twins_svt_small': 'position comes only from convolutions',
           'davit_tiny': 'position comes only from convolutions', 'coat_lite_tiny': 'position comes only from convolutions',
           'fastvit_t8': 'position comes only from convolutions', 'poolformer_s12': 'position comes only from convolutions',
           'mixer_s16_224': 'no RPI entry point is declared',
           **dict.fromkeys(('resnet10t', 'resnet18', 'convnext_atto', 'efficientnet_b0', 'mobilenetv3_small_050',
                            'regnety_002'), 'a CNN')}


def build(name: str) -> tuple[torch.nn.Module, torch.Tensor]:
    kw, s = ZOO[name]
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        m = timm.create_model(name, pretrained=False, **kw).eval()
    lo = torch.rand(3, 3, 4, 4, generator=torch.Generator().manual_seed(1))          # smooth images: real spatial structure
    return m, (F.interpolate(lo, size=s, mode='bilinear', align_corners=False) - .5) / .25


def cosines(f: torch.Tensor) -> np.ndarray:  # (B, C, h, w) -> (h*w, h*w), averaged over the images
    t = F.normalize(f.flatten(2).mT.double(), dim=-1)
    return (t @ t.mT).mean(0).numpy()


def ssdc_by_hand(f: torch.Tensor) -> float:  # (B, C, h, w)
    sim = cosines(f)
    h, w = f.shape[-2:]
    r, c = np.divmod(np.arange(h * w), w)
    i, j = np.triu_indices(h * w, 1)
    return spearmanr(sim[i, j], -(np.abs(r[i] - r[j]) + np.abs(c[i] - c[j]))).statistic


def pooled_by_hand(f: torch.Tensor, size: int) -> torch.Tensor:
    "The stride-4 grid of an image of side `size`: a finer map averaged over k x k cells."
    k = f.shape[-1] // (size // MIN_STRIDE)
    if k <= 1: return f
    B, C, h, w = f.shape
    return f.reshape(B, C, h // k, k, w // k, k).mean((3, 5))


def test_the_zoo_is_large_and_its_sizes_fit():
    assert len(ZOO) >= 30 and len({zoo_family(build(n)[0]) for n in ZOO}) >= 30


@pytest.mark.parametrize('name', ZOO)
def test_every_architecture_is_measured_or_refused_with_its_reason(name):
    m, x = build(name)
    cov = coverage(m, name, x.shape[-1])
    assert cov['unpermuted'] == 'yes' and '\n' not in cov['rpi'] and cov['taps'] not in ('', '?')
    normal = block_ssdc(m, [x], 'normal')
    assert normal['value'].notna().all() and np.isfinite(normal['value']).all()
    a = anatomy(m, strict=False)
    if a is not None:                                      # the anatomy's ViTs: as measure_ssdc reads them, unchanged
        want = measure_ssdc(m, [x], 'normal', show_progress=False).values[0]
        np.testing.assert_array_equal(normal['value'].to_numpy(), want)
        assert list(normal['tap']) == a.tap_names
    else:                                                  # every other model: timm's maps, on the grid rule, by hand
        with torch.no_grad(): maps = [pooled_by_hand(f, x.shape[-1]) for f in m.forward_intermediates(x, intermediates_only=True)]
        keep = [i for i, f in enumerate(maps) if f.shape[-2] * f.shape[-1] >= MIN_TOKENS]
        assert list(normal['layer']) == keep
        spread = [float(np.ptp(cosines(maps[i]))) for i in keep]      # similarities equal to float32 rounding rank at random
        got = normal['value'].to_numpy()
        np.testing.assert_allclose([v for v, s in zip(got, spread) if s > 1e-4],
                                   [ssdc_by_hand(maps[i]) for i, s in zip(keep, spread) if s > 1e-4], atol=2e-5)
    if name in REFUSED:
        assert cov['rpi'].startswith(REFUSED[name]), cov['rpi']
        with pytest.raises(ValueError, match=re.escape(cov['rpi'][:40])): block_ssdc(m, [x], 'rpi')
    else:
        assert cov['rpi'] == 'yes' and rpi_reason(m) is None
        rpi = block_ssdc(m, [x], 'rpi', n_perms=2)
        assert list(rpi['layer']) == list(normal['layer']) and set(rpi['n_perms']) == {2} and np.isfinite(rpi['value']).all()


def moved_by_hand(y: torch.Tensor, perm: torch.Tensor, layout: str, batch: int) -> torch.Tensor:
    "Slot j of the output holds token perm[j] of `y`, indexed for each layout."
    if layout in ('nlc', 'auto') and y.ndim == 3: return y[:, perm]
    if layout in ('nhwc', 'auto'): return y.reshape(y.shape[0], -1, y.shape[-1])[:, perm].reshape(y.shape)
    if layout == 'nchw': return y.reshape(*y.shape[:2], -1)[:, :, perm].reshape(y.shape)
    if layout == 'inner': return y.reshape(batch, -1, *y.shape[1:])[:, perm].reshape(y.shape)
    raise AssertionError(layout)


def n_tokens(y: torch.Tensor, layout: str, batch: int) -> int:
    if layout == 'nchw': return y.shape[-2] * y.shape[-1]
    if layout == 'inner': return len(y) // batch
    return y.shape[1] if y.ndim == 3 else y.shape[1] * y.shape[2]       # nlc, nhwc, auto


@pytest.mark.parametrize('name', [n for n in ZOO if n not in REFUSED])
def test_each_entry_moves_its_tokens(name):
    "The hook's output at every entry is the entry's own output with its patch tokens moved, in the entry's layout."
    m, x = build(name)
    seen = {}
    def keep(key):
        return lambda mod, inp, out: seen.__setitem__(key, (out[0] if isinstance(out, tuple) else out).clone())   # NaFlexViT adds its table in place
    entries = rpi_entries(m)
    with torch.no_grad():
        hs = [e.register_forward_hook(keep(('plain', i))) for i, (e, _) in enumerate(entries)]
        m(x)
        for h in hs: h.remove()
        tp = TokenPermutation(m, mode='draw', seed=3).attach()             # its hooks first, then the recorder's
        hs = [e.register_forward_hook(keep(('moved', i))) for i, (e, _) in enumerate(entries)]
        m(x)
        for h in hs: h.remove()
        tp.detach()
    for i, (e, layout) in enumerate(entries):
        y = seen[('plain', i)]
        n = n_tokens(y, layout, len(x))
        perm = tp.draw(1, n, 'cpu')[0]
        assert not torch.equal(perm, torch.arange(n))
        torch.testing.assert_close(seen[('moved', i)], moved_by_hand(y, perm, layout, len(x)), rtol=0, atol=0)
    assert all(len(e._forward_hooks) == 0 for e, _ in entries)                  # detached


POSITION = re.compile(r'pos_embed|patch_pos|attention_biases|rel_pos|pos_proj')
GLOBAL = ('cait_xxs24_224', 'naflexvit_base_patch16_gap', 'crossvit_tiny_240', 'pit_ti_224', 'levit_128s',
          'tnt_s_patch16_224', 'vit_relpos_small_patch16_224', 'convit_tiny')


@pytest.mark.parametrize('name', GLOBAL)
def test_position_enters_after_the_entry(name):
    "Position zeroed: the first map under RPI is the permuted unpermuted map; position in place: it is not."
    m, x = build(name)
    x = torch.randn(2, 3, *x.shape[-2:], generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        for p in m.parameters(): p.add_(torch.randn_like(p) * .1)          # wake blocks that start as identities
    errs = {}
    for case in ('zeroed', 'in place'):
        with torch.no_grad():
            hit = [p.copy_(torch.zeros_like(p) if case == 'zeroed' else torch.randn_like(p))
                   for n, p in m.named_parameters() if POSITION.search(n)]
            assert hit, name
            m.train(); m.eval()                                            # LeViT caches its attention biases in eval mode
            ref = m.forward_intermediates(x, intermediates_only=True)
            with TokenPermutation(m, mode='draw', seed=1) as tp: got = m.forward_intermediates(x, intermediates_only=True)
        firsts = [0, len(ref) // 2] if zoo_family(m) == 'crossvit' else [0]
        e = []
        for i in firsts:
            a, b = ref[i].flatten(2), got[i].flatten(2)
            e.append(((b - a[..., tp.draw(1, a.shape[-1], 'cpu')[0]]).norm() / a.norm()).item())
        errs[case] = max(e)
    assert errs['zeroed'] < 1e-5 and errs['in place'] > 1e-2, errs


def test_refused_models_name_the_reason_everywhere():
    cnn, _ = build('resnet10t')
    with pytest.raises(ValueError, match='RPI is not defined for this resnet model: a CNN'): TokenPermutation(cnn)
    with pytest.raises(ValueError, match='not a timm model'): rpi_entries(torch.nn.Linear(2, 2))
    assert timm_model(torch.nn.Linear(2, 2)) is None and coverage(torch.nn.Linear(2, 2))['unpermuted'].startswith('no: not a timm')
