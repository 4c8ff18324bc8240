"""pe_anchors.callback.permute: RPT / RPI callbacks around the patch-embedding permutation hook."""
import dataclasses

import pytest
import timm
import torch
from fastai.callback.core import Callback
from fastai.learner import Learner
import fastai.callback.progress  # noqa: F401  (Learner.no_bar)
from fastai.losses import CrossEntropyLossFlat
from fastai.torch_core import set_seed

from pe_anchors.callback.permute import RPT, RPI
from pe_anchors.core import unwrap_model
from pe_anchors.data import digits, ImageSplit
from pe_anchors.pos_embed import PE_NAMES
from pe_anchors.hooks import TokenPermutation


@pytest.fixture(scope='module')
def small_digits():
    d = digits(img_size=8)                                        # native 8x8 for the 1-pixel-patch test model
    return dataclasses.replace(d, train=ImageSplit(d.train.labels[:256], images=d.train.images[:256]),
                               valid=ImageSplit(d.valid.labels[:64], images=d.valid.images[:64]))


class Spy(Callback):
    "Store the permutation seen by each training batch and by each validation batch."
    order = 50
    def before_fit(self): self.train_perms, self.valid_perms = [], []
    def after_batch(self):
        cb = getattr(self.learn, 'rpt', None) or getattr(self.learn, 'rpi', None)
        lp = None if cb is None or cb.last_perm is None else cb.last_perm.clone()
        (self.train_perms if self.training else self.valid_perms).append(lp)


def _learner(data, cbs, pe='ape', seed=0):
    set_seed(seed)
    m = timm.create_model('pe_vit_nano_patch1_8', pe=pe, num_classes=10, depth=1)
    return Learner(data.dls(bs=64, device='cpu'), m, CrossEntropyLossFlat(), cbs=cbs)


def _fit(learn, epochs=1):
    with learn.no_logging(): learn.fit(epochs, 1e-3)
    return learn


def test_rpt_fresh_permutation_every_step_and_seeded(small_digits):
    a = _fit(_learner(small_digits, [RPT(seed=0), Spy()]), epochs=2)
    perms = torch.stack(a.spy.train_perms)                               # (steps, B, N)
    assert perms.shape == (8, 64, 64)
    assert torch.equal(perms.sort(-1).values, torch.arange(64).expand_as(perms))
    assert (perms == perms[:, :1]).all()                                 # 'batch': one permutation per forward pass
    assert len({tuple(p[0].tolist()) for p in perms}) == 8               # a fresh one every step
    b = _fit(_learner(small_digits, [RPT(seed=0), Spy()]), epochs=2)
    assert torch.equal(torch.stack(b.spy.train_perms), perms)            # same seed, same permutations
    c = _fit(_learner(small_digits, [RPT(seed=1), Spy()]), epochs=2)
    assert not torch.equal(torch.stack(c.spy.train_perms), perms)
    # validation batches ran with the hook off: the last permutation never changed during validation
    assert all(torch.equal(v, a.spy.train_perms[3]) for v in a.spy.valid_perms[:1])


def test_rpt_per_sample(small_digits):
    a = _fit(_learner(small_digits, [RPT('sample', seed=0), Spy()]))
    p = a.spy.train_perms[0]
    assert p.shape == (64, 64) and len({tuple(r.tolist()) for r in p}) == 64


def test_validation_untouched(small_digits):
    learn = _fit(_learner(small_digits, [RPT(seed=0)]))
    with learn.no_bar():
        v1, (p1, _) = learn.validate(), learn.get_preds()
        learn.remove_cb(RPT)
        v2, (p2, _) = learn.validate(), learn.get_preds()
    assert v1 == v2 and torch.equal(p1, p2)
    assert len(learn.model.patch_embed._forward_hooks) == 0


def test_rpt_training_differs_from_plain(small_digits):
    plain = _fit(_learner(small_digits, []))
    rpt = _fit(_learner(small_digits, [RPT(seed=0)]))
    assert not torch.equal(plain.model.head.weight, rpt.model.head.weight)


@pytest.mark.parametrize('pe', PE_NAMES)
def test_rpt_works_with_every_pe(small_digits, pe):
    learn = _fit(_learner(small_digits, [RPT(seed=0), Spy()], pe=pe))
    assert len(learn.spy.train_perms) == 4 and all(p is not None for p in learn.spy.train_perms)
    assert len(learn.model.patch_embed._forward_hooks) == 0


def shuffle_patches(img, perm, p):
    "Brute-force pixel shuffle: output block j (row-major) is input block perm[j]."
    out = img.clone()
    gw = img.shape[-1] // p
    for j, src in enumerate(perm.tolist()):
        rj, cj = divmod(j, gw); rs, cs = divmod(src, gw)
        out[..., rj * p:(rj + 1) * p, cj * p:(cj + 1) * p] = img[..., rs * p:(rs + 1) * p, cs * p:(cs + 1) * p]
    return out


@pytest.mark.parametrize('pe', PE_NAMES)
def test_token_permutation_equals_pixel_shuffle(pe):
    torch.manual_seed(0)
    m = timm.create_model('pe_vit_tiny_patch4_32', pe=pe, depth=2, num_classes=5).eval()
    x = torch.randn(3, 3, 32, 32)
    perm = torch.randperm(64)
    with torch.no_grad():
        tok = m.patch_embed(x)[:, perm]                                   # permute after the projection
        pix = m.patch_embed(shuffle_patches(x, perm, 4))                  # shuffle pixel blocks before it
        torch.testing.assert_close(tok, pix, atol=1e-5, rtol=1e-5)
        with TokenPermutation(m, perm=perm): y_hook = m(x)
        torch.testing.assert_close(y_hook, m(shuffle_patches(x, perm, 4)), atol=1e-4, rtol=1e-4)


def test_rpi_permutes_evaluation_only(small_digits):
    perm = torch.randperm(64, generator=torch.Generator().manual_seed(3))
    learn = _learner(small_digits, [])
    with learn.no_bar():
        p_clean, _ = learn.get_preds()
        p_rpi, _ = learn.get_preds(cbs=RPI(perm=perm))
    x = torch.cat([xb for xb, _ in learn.dls.valid])
    with torch.no_grad(): ref = learn.model.eval()(shuffle_patches(x, perm, 1)).softmax(-1)
    torch.testing.assert_close(p_rpi, ref, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(p_rpi, p_clean)
    spy = Spy(); learn = _learner(small_digits, [RPI(seed=0), spy])
    _fit(learn)
    assert all(p is None for p in spy.train_perms) and all(p is not None for p in spy.valid_perms)


def test_state_dict_resumes_the_permutation_stream(small_digits):
    a = _learner(small_digits, [RPT(seed=5)])
    _fit(a)
    state = a.rpt.state_dict()
    assert state and all(isinstance(v, torch.Tensor) for v in state.values())
    nxt = TokenPermutation(a.model, seed=5)
    nxt.load_state_dict(state)
    want = nxt.draw(1, 64, 'cpu')
    b = _learner(small_digits, [RPT(seed=5), Spy()])
    b.rpt.load_state_dict(state)
    _fit(b)
    assert torch.equal(b.spy.train_perms[0][0], want[0])


def test_unwrap_model():
    m = timm.create_model('pe_vit_nano_patch1_8', depth=1)
    assert unwrap_model(torch.nn.DataParallel(m)) is m and unwrap_model(m) is m
    assert unwrap_model(torch.compile(m)) is m
