"""One answer to "what kind of ViT is this?": the anatomy of every supported model, and no other module deciding it."""
import re
from pathlib import Path

import pytest
import timm
import torch

import pe_anchors.vit  # noqa: F401  (registers the pe_vit_* models)
from pe_anchors.anatomy import FAMILIES, anatomy, model_family, position_parameters
from pe_anchors.pos_embed import PE_NAMES
from pe_anchors.vit import TokenPermutation, TokenRecorder

ROOT = Path(__file__).resolve().parents[1]
SMALL = {   # timm name: shrunk kwargs, family, position kinds, prefix tokens
    'vit_tiny_patch16_224': (dict(img_size=32, patch_size=4, depth=2), 'vit', ('additive',), 1),
    'deit_tiny_distilled_patch16_224': (dict(img_size=32, patch_size=4, depth=2), 'vit', ('additive',), 2),
    'eva02_tiny_patch14_224': (dict(img_size=28, patch_size=4, depth=2), 'eva', ('additive', 'rotary'), 1),
    'vit_small_patch16_rope_mixed_224': (dict(img_size=32, patch_size=4, depth=2), 'eva', ('rotary',), 1),
    'beit_base_patch16_224': (dict(img_size=32, patch_size=4, depth=2, embed_dim=64, num_heads=2), 'beit', ('bias',), 1),
    'swin_tiny_patch4_window7_224': (dict(img_size=56, depths=(1, 2), num_heads=(2, 4), embed_dim=32), 'swin', ('bias',), 0),
}


@pytest.mark.parametrize('name', SMALL)
def test_timm_families(name):
    kw, family, position, prefix = SMALL[name]
    m = timm.create_model(name, **kw).eval()
    a = anatomy(m)
    assert (a.family, a.position, a.num_prefix_tokens, model_family(name)) == (family, position, prefix, family)
    assert a.taps == [b.norm1 for b in a.blocks] and len(a.blocks) == len([n for n, _ in m.named_modules() if n.endswith('.norm1')])
    # the recorded tap output has the prefix tokens and the grid the anatomy states, block by block
    x = torch.randn(2, 3, *a.img_size)
    with TokenRecorder(m) as rec, torch.no_grad(): m(x)
    for t, (h, w) in zip(rec.layer_features(), a.grids): assert t.shape[1] == prefix + h * w
    # a permutation of the patch embedding's tokens moves the tokens of block 0 with them (no prefix token is moved)
    perm = torch.randperm(a.grid_size[0] * a.grid_size[1])
    with TokenRecorder(m, 'resid', layers=[0]) as rec, torch.no_grad(): m(x)
    ref = rec.patch_tokens('resid')[0]                                     # (B, N, C) entering block 0
    if 'additive' not in a.position:                                       # nothing added between embedding and block 0
        with TokenRecorder(m, 'resid', layers=[0]) as rec, TokenPermutation(m, perm=perm), torch.no_grad(): m(x)
        torch.testing.assert_close(rec.patch_tokens('resid')[0], ref[:, perm])


@pytest.mark.parametrize('pe', PE_NAMES)
def test_pe_vit_position_kinds_follow_the_pe_flags(pe):
    m = timm.create_model('pe_vit_nano_patch1_8', pe=pe)
    a = anatomy(m)
    flags = m.pos_embed
    assert ('additive' in a.position, 'rotary' in a.position, 'bias' in a.position, 'conditional' in a.position) == \
           (flags.additive, flags.rotary, flags.biased, flags.mixing)
    assert ('rotary' in a.position) == (pe in ('rope', 'rope_mixed', 'ape_rope', 'rope_dinov3'))   # never 'additive' for RoPE alone
    assert {id(p) for p in position_parameters(m)} == {id(p) for p in m.pos_embed.parameters()}


def test_wrappers_and_refusals():
    vit = timm.create_model('pe_vit_nano_patch1_8', pe='ape')
    class Body(torch.nn.Module):
        def __init__(self): super().__init__(); self.model = vit
    for wrapped in (torch.nn.DataParallel(vit), torch.compile(vit), torch.nn.Sequential(Body(), torch.nn.Linear(3, 3))):
        assert anatomy(wrapped).model is vit
    with pytest.raises(ValueError, match='is not a ViT'): anatomy(timm.create_model('resnet10t'))
    with pytest.raises(ValueError, match='no rotary'): anatomy(vit).rope_tables()
    assert set(FAMILIES) == {'pe_vit', 'vit', 'eva', 'beit', 'swin'}


def test_only_the_anatomy_decides_what_a_model_is():
    "No other module tests a model's class, probes its attributes or reads its name to decide what kind of model it is."
    bad = re.compile(r"isinstance\([^)]*\b(PEViT|PosEmbed|NoPE|VisionTransformer|Eva|Beit|SwinTransformer)\b"
                     r"|startswith\(['\"]pe_vit"
                     r"|hasattr\((model|m|net|vit|self\.model)\s*,\s*['\"](blocks|patch_embed|pos_embed|rope|norm1)"
                     r"|getattr\((model|m|net|vit|self\.model)\s*,\s*['\"](blocks|patch_embed|pos_embed|rope|num_prefix_tokens)")
    hits = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}" for p in sorted((ROOT / 'pe_anchors').rglob('*.py'))
            if p.name not in ('anatomy.py', '_modidx.py')
            for i, line in enumerate(p.read_text().splitlines(), 1) if bad.search(line)]
    assert not hits, '\n'.join(hits)
