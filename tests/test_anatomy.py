"""One answer to "what kind of ViT is this?": the anatomy of every supported model and the facts it states about each
family (where position comes from, how rope tables pair channels, prefix tokens); None for a model that is not one."""
import pytest
import timm
import torch

import pe_anchors.vit  # noqa: F401  (registers the pe_vit_* models)
from pe_anchors.anatomy import FAMILIES, anatomy, model_family, position_parameters
from pe_anchors.pos_embed import PE_NAMES
from pe_anchors.hooks import TokenPermutation, TokenRecorder

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


SMALL_VIT = dict(img_size=32, patch_size=4, depth=2)
FACTS = {   # the model, and the facts its anatomy states: family, position kinds, rope layout, prefix tokens, PE padding
    'pe_vit-ape': (lambda: timm.create_model('pe_vit_nano_patch1_8', pe='ape'), 'pe_vit', ('additive',), None, 1, None),
    'pe_vit-rope': (lambda: timm.create_model('pe_vit_nano_patch1_8', pe='rope'), 'pe_vit', ('rotary',), 'quarters', 1, None),
    'pe_vit-rope_mixed': (lambda: timm.create_model('pe_vit_nano_patch1_8', pe='rope_mixed'), 'pe_vit', ('rotary',), 'quarters', 1, None),
    'pe_vit-ape_rope': (lambda: timm.create_model('pe_vit_nano_patch1_8', pe='ape_rope'), 'pe_vit', ('additive', 'rotary'), 'quarters', 1, None),
    'pe_vit-rpb': (lambda: timm.create_model('pe_vit_nano_patch1_8', pe='rpb'), 'pe_vit', ('bias',), None, 1, None),
    'pe_vit-peg': (lambda: timm.create_model('pe_vit_nano_patch1_8', pe='peg'), 'pe_vit', ('conditional',), None, 1, 'zeros'),
    'pe_vit-nope': (lambda: timm.create_model('pe_vit_nano_patch1_8', pe='none'), 'pe_vit', (), None, 1, None),
    'vit': (lambda: timm.create_model('vit_tiny_patch16_224', **SMALL_VIT), 'vit', ('additive',), None, 1, None),
    'eva02': (lambda: timm.create_model('eva02_tiny_patch14_224', img_size=28, patch_size=4, depth=2), 'eva', ('additive', 'rotary'),
              'interleaved', 1, None),
    'rope-vit': (lambda: timm.create_model('vit_small_patch16_rope_224', **SMALL_VIT), 'eva', ('rotary',), 'interleaved', 1, None),
    'dinov3': (lambda: timm.create_model('vit_base_patch16_dinov3', **SMALL_VIT), 'eva', ('rotary',), 'half', 5, None),
    'beit': (lambda: timm.create_model('beit_base_patch16_224', **SMALL_VIT, embed_dim=64, num_heads=2), 'beit', ('bias',), None, 1, None),
    'swin': (lambda: timm.create_model('swin_tiny_patch4_window7_224', img_size=56, depths=(1, 2), num_heads=(2, 4), embed_dim=32),
             'swin', ('bias',), None, 0, None),
}


def _pairs(sin: torch.Tensor) -> str:
    "How a sine table pairs its channels, read from its values: the layout a model states must be this one."
    d = sin.shape[-1]
    if torch.equal(sin[..., 0::2], sin[..., 1::2]): return 'interleaved'
    if torch.equal(sin[..., :d // 2], sin[..., d // 2:]): return 'half'
    n = d // 4
    if torch.equal(sin[..., :n], sin[..., n:2 * n]) and torch.equal(sin[..., 2 * n:3 * n], sin[..., 3 * n:]): return 'quarters'
    return 'none'


@pytest.mark.parametrize('name', FACTS)
def test_each_family_states_its_facts(name):
    "Each family's anatomy: where position comes from, how its rope tables pair channels, its prefix tokens, its PE's padding."
    build, family, position, layout, prefix, padding = FACTS[name]
    a = anatomy(build())
    assert (a.family, a.position, a.rope_layout, a.num_prefix_tokens) == (family, position, layout, prefix)
    assert (a.pos_embed.padding_mode if a.pos_embed is not None else None) == padding      # asked of the PE, never probed
    if a.rotary:                                        # the declared layout is how its tables pair (what a knockout edits)
        assert {_pairs(t.float().chunk(2, -1)[0]) for t in a.rope_tables()} == {layout}
    else:
        with pytest.raises(ValueError, match='no rotary'): a.rope_tables()


def test_a_model_that_is_not_a_vit_is_none_to_callers_that_only_ask():
    cnn = timm.create_model('resnet10t')
    assert anatomy(cnn, strict=False) is None and position_parameters(cnn) == []
    with pytest.raises(ValueError, match='is not a ViT'): anatomy(cnn)
    pe = timm.create_model('pe_vit_nano_patch1_8', pe='ape').pos_embed
    with pytest.raises(ValueError, match='has no convolution to pad'), pe.padded('circular'): pass


@pytest.mark.parametrize('name, kw, family, position', [
    ('mvitv2_tiny', dict(img_size=(64, 64)), 'mvitv2', ('bias',)),
    ('mvitv2_tiny', dict(img_size=(64, 64), abs_pos=True), 'mvitv2', ('additive', 'bias')),   # an optional table, read
    ('convit_tiny', dict(img_size=32, patch_size=4, depth=2, local_up_to_layer=1), 'convit', ('additive', 'bias')),
    ('convit_tiny', dict(img_size=32, patch_size=4, depth=2, local_up_to_layer=1, use_pos_embed=False), 'convit', ('bias',)),
    ('naflexvit_base_patch16_gap', dict(img_size=32, patch_size=4, depth=2, embed_dim=64, num_heads=2), 'naflexvit', ('additive',)),
    ('xcit_nano_12_p8_224', dict(img_size=64, depth=2), 'xcit', ('additive', 'conditional')),
    ('twins_svt_small', dict(img_size=64, depths=(1, 1, 1, 1)), 'twins', ('conditional',)),
    ('convnext_atto', {}, 'convnext', ()),
])
def test_zoo_family_and_position(name, kw, family, position):
    "The other timm families: named by the module that defines them, their position read from the model (optional tables included)."
    from pe_anchors.anatomy import rpi_reason, zoo_family, zoo_position
    if kw.pop('abs_pos', False):                           # MViTv2 takes it in its config
        from timm.models.mvitv2 import MultiScaleVit, MultiScaleVitCfg
        m = MultiScaleVit(MultiScaleVitCfg(depths=(1, 1, 1, 1), use_abs_pos=True), **kw)
    else: m = timm.create_model(name, **kw)
    assert (zoo_family(m), zoo_position(m)) == (family, position)
    assert anatomy(m, strict=False) is None and (rpi_reason(m) is None) == (family not in ('twins', 'convnext'))
    wrapped = torch.nn.Sequential(m)                                       # found inside another module, as the anatomy does
    assert (zoo_family(wrapped), zoo_position(wrapped)) == (family, position)
