"""The PE families beyond the paper (RPB, APE+RoPE, DINOv3 RoPE, PEG, ALiBi): references, NoPE limits, no
permutation equivariance, checkpoints, resolution changes, and every analysis running on them unchanged."""
import math

import numpy as np
import pytest
import timm
import torch
import torch.nn.functional as F

import pe_anchors  # noqa: F401
from pe_anchors.core import CONDITIONS, EXTENSION_CONDITIONS, grid_coords
from pe_anchors.pos_embed import (ALiBi2D, APERoPE, RoPE2D, RoPEDinoV3, RoPEMixed, alibi_slopes, apply_rope, rope_to_timm,
                                  swap_quarters)
from pe_anchors.vit import PEViT, TokenPermutation, save_checkpoint, load_checkpoint

NEW = ('rpb', 'ape_rope', 'rope_dinov3', 'peg', 'alibi')


def vit(pe, seed=0, **kw):
    torch.manual_seed(seed)
    return PEViT(img_size=16, patch_size=2, embed_dim=32, depth=3, num_heads=2, num_classes=5, pe=pe, **kw).eval()


def sharpen(m, pe_scale=30.):
    "Make position matter at initialisation: larger position parameters and sharper attention."
    with torch.no_grad():
        for p in m.pos_embed.parameters(): p.mul_(pe_scale)
        if hasattr(m.pos_embed, 'slopes'): m.pos_embed.slopes.mul_(pe_scale)      # ALiBi's fixed slopes
        for blk in m.blocks: blk.attn.qkv.weight.mul_(10)
    return m


def test_conditions_and_names():
    for c in NEW: assert c in CONDITIONS and c in EXTENSION_CONDITIONS and CONDITIONS[c]['pe'] == c
    for c in NEW: assert timm.create_model('pe_vit_nano_patch2_16', pe=c).pos_embed is not None


def test_attention_with_a_bias_against_a_written_out_softmax():
    m = sharpen(vit('rpb'))
    x = torch.randn(2, 3, 16, 16)
    blk, attn = m.blocks[1], m.blocks[1].attn
    tokens = m._embed(x)
    tokens = m.blocks[0](tokens, attn_bias=m.pos_embed.attn_bias(0))
    h = blk.norm1(tokens)
    q, k, v = attn._qkv(h).unbind(0)
    bias = m.pos_embed.attn_bias(1)
    logits = torch.einsum('bhnd,bhmd->bhnm', q, k) / math.sqrt(attn.head_dim) + bias
    want = attn.proj((logits.softmax(-1) @ v).transpose(1, 2).reshape(2, -1, 32))
    torch.testing.assert_close(attn(h, attn_bias=bias), want, atol=1e-5, rtol=1e-5)
    attn.fused_attn = False
    torch.testing.assert_close(attn(h, attn_bias=bias), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize('pe', ['rpb', 'peg', 'alibi'])
def test_zero_position_parameters_are_nope(pe):
    x = torch.randn(2, 3, 16, 16)
    m, nope = vit(pe), vit('none')
    nope.load_state_dict({k: v for k, v in m.state_dict().items() if not k.startswith('pos_embed.')})
    with torch.no_grad():
        if pe == 'alibi': m.pos_embed.slopes.zero_()
        else:
            for p in m.pos_embed.parameters(): p.zero_()
        torch.testing.assert_close(m(x), nope(x))


def test_ape_rope_alphas_act_separately():
    m = vit('ape_rope')
    x = torch.randn(2, 3, 16, 16)
    ape, rope = vit('ape'), vit('rope')
    sd = m.state_dict()
    ape.load_state_dict({**{k: v for k, v in sd.items() if not k.startswith('pos_embed.')}, 'pos_embed.pos_embed': sd['pos_embed.ape.pos_embed']})
    rope.load_state_dict({k: v for k, v in sd.items() if not k.startswith('pos_embed.')})
    with torch.no_grad():
        with m.pos_embed.scaled(0., part='rope'): torch.testing.assert_close(m(x), ape(x))     # RoPE off: the APE model
        with m.pos_embed.scaled(0., part='ape'): torch.testing.assert_close(m(x), rope(x))     # table off: the RoPE model
    assert m.pos_embed.alpha_ape == m.pos_embed.alpha_rope == 1.
    m.pos_embed.alpha = .5
    assert m.pos_embed.alpha_ape == m.pos_embed.alpha_rope == .5


@pytest.mark.parametrize('pe', NEW)
def test_not_permutation_equivariant(pe):
    m = sharpen(vit(pe))
    x = torch.randn(2, 3, 16, 16)
    perm = torch.randperm(64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        base = m(x)
        with TokenPermutation(m, perm=perm): out = m(x)
    assert ((out - base).norm() / base.norm()) > .02, pe
    nope = vit('none')
    with torch.no_grad(), TokenPermutation(nope, perm=perm): torch.testing.assert_close(nope(x), vit('none')(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize('pe', NEW)
def test_checkpoint_round_trip(pe, tmp_path):
    m = timm.create_model('pe_vit_nano_patch2_16', pe=pe)
    with torch.no_grad():
        for p in m.pos_embed.parameters(): p.add_(torch.randn_like(p))
    save_checkpoint(m, tmp_path / 'm.safetensors')
    back = load_checkpoint(tmp_path / 'm.safetensors').eval()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad(): torch.testing.assert_close(back(x), m.eval()(x))


def test_resolution_change_resizes_tables():
    m = vit('rpb')
    old = m.pos_embed.tables[0].relative_position_bias_table.shape
    m.set_input_size(32)
    assert m.grid_size == (16, 16) and m.pos_embed.tables[0].relative_position_bias_table.shape == ((2 * 16 - 1) ** 2 + 3, old[1])
    assert m(torch.randn(1, 3, 32, 32)).shape == (1, 5)
    a = vit('ape'); t0 = a.pos_embed.pos_embed.detach().clone()
    a.set_input_size(32)
    assert a.pos_embed.pos_embed.shape == (1, 1 + 256, 32) and torch.equal(a.pos_embed.pos_embed[:, :1], t0[:, :1])
    r = vit('rope_dinov3'); r.set_input_size(32)
    c = r.pos_embed.coords
    assert c.shape == (256, 2) and c.min() > -1 and c.max() < 1
    al = vit('alibi'); al.set_input_size(32)
    assert al.pos_embed.attn_bias().shape == (1, 2, 257, 257)


def test_dinov3_coordinate_augmentation_only_in_training():
    m = vit('rope_dinov3')
    pe = m.pos_embed
    m.eval(); a0 = pe.base_angles().clone()
    m.train(); torch.manual_seed(1); a1 = pe.base_angles().clone()
    assert not torch.allclose(a0, a1)
    valid = a0.abs() > 1e-3
    ratio = a1[valid] / a0[valid]
    assert torch.allclose(ratio, ratio[0], rtol=1e-4) and ratio[0] != 1                     # one global rescale, no shift
    m.eval(); torch.testing.assert_close(pe.base_angles(), a0)


def _dinov3_written_out(H, W, hd, seed, shift, jitter, rescale):
    "DINOv3's angles with the draws made by hand: ((c + shift) * jitter) * rescale, column planes first (our order)."
    torch.manual_seed(seed)                                              # the draws in DINOv3's order: shift, jitter, rescale
    s = torch.empty(2).uniform_(-shift, shift)
    j = torch.empty(2).uniform_(-math.log(jitter), math.log(jitter)).exp()
    r = torch.empty(1).uniform_(-math.log(rescale), math.log(rescale)).exp()
    rows, cols = torch.meshgrid(torch.arange(H), torch.arange(W), indexing='ij')
    c = torch.stack([(rows.flatten() + .5) / H, (cols.flatten() + .5) / W], 1) * 2 - 1      # (N, 2) in [-1, 1]
    c = ((c + s) * j) * r
    period = 100. ** (2 * torch.arange(hd // 4, dtype=torch.float32) / (hd // 2))
    return torch.cat([2 * math.pi * c[:, 1:] / period, 2 * math.pi * c[:, :1] / period], 1)


@pytest.mark.parametrize('aug_draw', ['block', 'pass'])
def test_dinov3_augmentation_order_matches_formula(aug_draw):
    H, W, hd = 3, 5, 16
    pe = RoPEDinoV3((H, W), hd, 2, shift=.5, jitter=1.5, rescale=2., aug_draw=aug_draw).train()
    torch.manual_seed(7)
    if aug_draw == 'pass': pe(torch.zeros(1, 1 + H * W, 8))              # the pass's draw is made in forward
    got = pe.base_angles()[0]
    want = _dinov3_written_out(H, W, hd, 7, .5, 1.5, 2.)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    from timm.layers import RotaryEmbeddingDinoV3                         # second reference: timm's port, training mode
    t = RotaryEmbeddingDinoV3(hd, temperature=100., feat_shape=[H, W], shift_coords=.5, jitter_coords=1.5,
                              rescale_coords=2.).train()
    torch.manual_seed(7); sin = t.get_embed().chunk(2, -1)[0][:, :hd // 2]   # (row planes, column planes)
    torch.testing.assert_close(torch.sin(got), torch.cat([sin[:, hd // 4:], sin[:, :hd // 4]], 1), atol=1e-5, rtol=1e-5)


def _block_ropes(m, x):
    got = {}
    hooks = [b.register_forward_pre_hook(lambda mod, a, kw, i=i: got.__setitem__(i, kw['rope']), with_kwargs=True)
             for i, b in enumerate(m.blocks)]
    with torch.no_grad(): m(x)
    for h in hooks: h.remove()
    return got


def test_dinov3_draws_per_block():
    x = torch.randn(1, 3, 16, 16)
    m = vit('rope_dinov3')                                                   # aug_draw='block', the default
    assert m.pos_embed.aug_draw == 'block'
    r = _block_ropes(m.train(), x)
    assert not torch.equal(r[0], r[1]) and not torch.equal(r[1], r[2])       # training: each block its own draw
    r = _block_ropes(m.eval(), x)
    assert torch.equal(r[0], r[1]) and torch.equal(r[0], r[2])               # evaluation: the same table
    ev = r[0]
    p = vit('rope_dinov3', pe_kwargs=dict(aug_draw='pass'))
    r = _block_ropes(p.train(), x)
    assert torch.equal(r[0], r[1]) and torch.equal(r[0], r[2]) and not torch.equal(r[0], ev)   # one draw for the pass
    with pytest.raises(ValueError, match="'block', 'pass'"): vit('rope_dinov3', pe_kwargs=dict(aug_draw='layer'))


def _press_slopes(n):
    "ALiBi's slopes as published by Press et al. (get_slopes in their code), written out."
    def pow2(n):
        start = 2 ** (-2 ** -(math.log2(n) - 3))
        return [start * start ** i for i in range(n)]
    if math.log2(n).is_integer(): return pow2(n)
    p = 2 ** math.floor(math.log2(n))
    return pow2(p) + _press_slopes(2 * p)[0::2][:n - p]


@pytest.mark.parametrize('heads', [4, 6, 8, 12])
def test_alibi_slopes_follow_press(heads):
    torch.testing.assert_close(alibi_slopes(heads), torch.tensor(_press_slopes(heads), dtype=torch.float32))
    torch.testing.assert_close(ALiBi2D(4, heads).slopes, alibi_slopes(heads))            # the default
    geo = 2. ** (-8. * torch.arange(1, heads + 1) / heads)
    torch.testing.assert_close(alibi_slopes(heads, 'geometric'), geo.float())
    torch.testing.assert_close(ALiBi2D(4, heads, slope_scheme='geometric').slopes, geo.float())
    if heads == 6: torch.testing.assert_close(alibi_slopes(6), torch.tensor([.25, .0625, .015625, .00390625, .5, .125]))
    m = PEViT(img_size=8, patch_size=2, embed_dim=8 * heads, depth=1, num_heads=heads, pe='alibi')
    torch.testing.assert_close(m.pos_embed.slopes, torch.tensor(_press_slopes(heads), dtype=torch.float32))


@pytest.mark.parametrize('pe', ['ape_rope', 'rope'])
def test_rope_reference_grid_on_resolution_change(pe):
    "EVA-02 (timm's ref_feat_shape): after a resize, coordinates are index * ref / grid; by default integer indices."
    theta_k = 10000. ** (-torch.arange(4, dtype=torch.float64) / 4)                     # head_dim 16: n = 4
    def want(grid, scale):
        rows, cols = torch.meshgrid(torch.arange(grid), torch.arange(grid), indexing='ij')
        x, y = cols.flatten()[:, None] * scale, rows.flatten()[:, None] * scale
        return torch.cat([x * theta_k, y * theta_k], 1).float()
    plain, eva = vit(pe), vit(pe, pe_kwargs=dict(ref_grid_size=8))                      # 16 px, patch 2: an 8x8 grid
    torch.testing.assert_close(eva.pos_embed.base_angles()[0], plain.pos_embed.base_angles()[0])   # same at the ref grid
    for m in (plain, eva): m.set_input_size(32)                                          # 16x16 grid
    torch.testing.assert_close(plain.pos_embed.base_angles()[0], want(16, 1.))
    torch.testing.assert_close(eva.pos_embed.base_angles()[0], want(16, 8 / 16))
    assert eva(torch.randn(1, 3, 32, 32)).shape == (1, 5)
    late = vit(pe); late.pos_embed.ref_grid_size = late.pos_embed.grid_size             # a trained model, resized EVA's way
    late.set_input_size(32)
    torch.testing.assert_close(late.pos_embed.base_angles()[0], want(16, 8 / 16))


def test_resized_model_checkpoint_rebuilds_it(tmp_path):
    m = timm.create_model('pe_vit_nano_patch2_16', pe='ape_rope', num_classes=5)
    m.pos_embed.ref_grid_size = m.pos_embed.grid_size
    m.set_input_size(32); m.eval()
    back = load_checkpoint(save_checkpoint(m, tmp_path / 'm.safetensors')).eval()
    assert back.pos_embed.ref_grid_size == (8, 8) and back.grid_size == (16, 16)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad(): assert torch.equal(back(x), m(x))


@pytest.mark.parametrize('kind', ['rope', 'rope_mixed', 'rope_dinov3'])
def test_rope_layout_converts_to_timm(kind):
    "Our table pairs quarter 1 with 2 and 3 with 4; swapping the middle quarters gives timm's rotate-half layout."
    from timm.layers import apply_rot_embed_cat
    torch.manual_seed(0)
    pe = {'rope': RoPE2D, 'rope_mixed': RoPEMixed, 'rope_dinov3': RoPEDinoV3}[kind]((4, 6), 16, 3).eval()
    t, q = pe.rope(0), torch.randn(2, 3, 24, 16)
    ours = apply_rope(q, t)
    timm_rot = swap_quarters(apply_rot_embed_cat(swap_quarters(q), rope_to_timm(t), half=True))
    torch.testing.assert_close(timm_rot, ours, atol=1e-5, rtol=1e-5)
    assert (apply_rot_embed_cat(q, t, half=True) - ours).abs().max() > .1                # unconverted: other pairs
    torch.testing.assert_close(swap_quarters(swap_quarters(q)), q)
    sin = t.chunk(2, -1)[0]                                                              # the layout stated in the docs
    torch.testing.assert_close(sin[..., :4], sin[..., 4:8]); torch.testing.assert_close(sin[..., 8:12], sin[..., 12:])


@pytest.mark.parametrize('pe', NEW)
def test_every_analysis_runs(pe):
    from pe_anchors.interventions import measure_ssdc, alpha_sweep, pe_table_ssdc
    from pe_anchors.robustness import evaluate_accuracy, make_shift
    from pe_anchors.mech.position import fit_position_probes, layer_tokens
    m = sharpen(vit(pe))
    g = torch.Generator().manual_seed(0)
    x = F.interpolate(torch.randn(24, 3, 4, 4, generator=g), size=16, mode='bilinear', align_corners=False)
    batches = [x[:12], x[12:]]
    assert measure_ssdc(m, batches).values.shape == (1, 3)
    runs = measure_ssdc(m, batches, 'rpi', n_perms=2)
    assert runs.values.shape == (2, 3) and np.isfinite(runs.values).all()
    sweep = alpha_sweep(m, batches, alphas=(1., 0.), n_perms=2)
    assert set(sweep.alpha) == {1., 0.}
    u8 = (x.clamp(-2, 2) * 60 + 128).to(torch.uint8)
    acc = evaluate_accuracy(m, [(u8, torch.zeros(24, dtype=torch.long))], normalize=((.5,) * 3, (.25,) * 3),
                            shift=make_shift('jpeg'))
    assert 0 <= acc <= 1
    probes = fit_position_probes(layer_tokens(m, batches, 1), m.grid_size, steps=20)
    assert set(probes.table.target) == {'position', 'row', 'col'}
    if pe == 'ape_rope': assert abs(pe_table_ssdc(m)) < 1                                  # its table has a structure
    if pe in ('ape_rope', 'rope_dinov3'):
        from pe_anchors.mech.position import rope_knockout
        with torch.no_grad():
            base = m(x)
            with rope_knockout(m, 'all'): out = m(x)
        assert not torch.allclose(base, out)
