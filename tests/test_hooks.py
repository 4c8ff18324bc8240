"""pe_anchors.hooks: token permutation (equivariance of a model without position, the modes and their seeds) and the
residual-stream recorder on timm's models."""
import torch
import timm

import pe_anchors  # noqa: F401  (registers the pe_vit_* models)
from pe_anchors.hooks import TokenRecorder, TokenPermutation


def test_permutation_equivariance_paper_config():
    torch.manual_seed(0)
    x, perm = torch.randn(2, 3, 224, 224), torch.randperm(196)
    for pe in ('none', 'ape'):
        m = timm.create_model('pe_vit_small_patch16_224', pe=pe).eval()
        with torch.no_grad():
            for blk in m.blocks: blk.attn.qkv.weight.mul_(3)   # sharper attention; x10 turns 12 layers chaotic in fp32
            if pe == 'ape': m.pos_embed.pos_embed.mul_(50)
            with TokenRecorder(m, 'block', layers=[11]) as rec: base = m(x)
            ref = rec.patch_tokens('block')
            with TokenRecorder(m, 'block', layers=[11]) as rec, TokenPermutation(m, perm=perm): out = m(x)
        err = (rec.patch_tokens('block') - ref[:, :, perm]).norm() / ref.norm()
        if pe == 'none':
            torch.testing.assert_close(out, base, atol=1e-5, rtol=1e-4); assert err < 1e-5
        else:
            assert err > 0.05 and ((out - base).norm() / base.norm()) > 0.01


def test_per_sample_permutation_is_a_permutation_and_seeded():
    m = timm.create_model('pe_vit_nano_patch1_8', pe='none').eval()
    x = torch.randn(5, 3, 8, 8)
    with torch.no_grad(), TokenPermutation(m, mode='sample', seed=3) as tp: m(x)
    p = tp.last_perm
    assert p.shape == (5, 64) and torch.equal(p.sort(1).values, torch.arange(64).expand(5, -1))
    with torch.no_grad(), TokenPermutation(m, mode='sample', seed=3) as tp2: m(x)
    assert torch.equal(tp2.last_perm, p)


def test_recorder_on_timm_vit():
    m = timm.create_model('vit_tiny_patch16_224', pretrained=False, num_classes=0, img_size=32, patch_size=8).eval()
    with torch.no_grad(), TokenRecorder(m, ('ln1', 'block')) as rec, TokenPermutation(m, seed=0): m(torch.randn(2, 3, 32, 32))
    assert rec.patch_tokens('ln1').shape == (12, 2, 16, 192)
