"""pe_anchors.pos_embed: every positional encoding against its formula written out, the families beyond the paper
against their references (timm, Press et al., DINOv3), alpha, resolution changes and bad input."""
import math

import pytest
import torch
import timm
from hypothesis import given, settings, strategies as st

import pe_anchors  # noqa: F401
from pe_anchors.pos_embed import (PE_NAMES, SinCos2D, RoPE2D, RoPEMixed, LearnedAPE, NoPE, create_pos_embed,
                                  apply_rope, ALiBi2D, RoPEDinoV3, alibi_slopes, rope_partners, rope_to_timm,
                                  swap_quarters)
from pe_anchors.vit import PEViT

from conftest import small_vit


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


def _block_ropes(m, x):
    got = {}
    hooks = [b.register_forward_pre_hook(lambda mod, a, kw, i=i: got.__setitem__(i, kw['rope']), with_kwargs=True)
             for i, b in enumerate(m.blocks)]
    with torch.no_grad(): m(x)
    for h in hooks: h.remove()
    return got


def _press_slopes(n):
    "ALiBi's slopes as published by Press et al. (get_slopes in their code), written out."
    def pow2(n):
        start = 2 ** (-2 ** -(math.log2(n) - 3))
        return [start * start ** i for i in range(n)]
    if math.log2(n).is_integer(): return pow2(n)
    p = 2 ** math.floor(math.log2(n))
    return pow2(p) + _press_slopes(2 * p)[0::2][:n - p]


def test_sincos_matches_written_out_formula():
    D, H, W = 24, 4, 3
    pe = SinCos2D((H, W), D, num_prefix_tokens=1).grid_table[0]
    for k in range(H * W):
        y, x = k // W, k % W
        for j in range(D // 4):
            w = 10000 ** (-j / (D / 4))
            assert pe[k, j] == pytest.approx(math.sin(x * w), abs=1e-6)
            assert pe[k, D // 4 + j] == pytest.approx(math.cos(x * w), abs=1e-6)
            assert pe[k, D // 2 + j] == pytest.approx(math.sin(y * w), abs=1e-6)
            assert pe[k, 3 * D // 4 + j] == pytest.approx(math.cos(y * w), abs=1e-6)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 3), st.integers(0, 4), st.integers(0, 3), st.integers(0, 4), st.integers(-2, 2), st.integers(-3, 3),
       st.sampled_from(['rope', 'rope_mixed']))
def test_rope_score_is_translation_invariant(r1, c1, r2, c2, dr, dc, kind):
    H, W, hd = 6, 8, 16
    torch.manual_seed(1)
    rope = (RoPE2D if kind == 'rope' else RoPEMixed)((H, W), hd, num_heads=1, num_prefix_tokens=0)
    q, k = torch.randn(hd), torch.randn(hd)
    def score(i, j):
        Q = torch.zeros(1, 1, H * W, hd); K = torch.zeros_like(Q)
        Q[0, 0, i], K[0, 0, j] = q, k
        with torch.no_grad(): Qr, Kr = apply_rope(Q, rope.rope(0)), apply_rope(K, rope.rope(0))   # as a block's attention
        return float(Qr[0, 0, i] @ Kr[0, 0, j])
    def idx(r, c): return r * W + c
    R1, C1, R2, C2 = r1 + dr, c1 + dc, r2 + dr, c2 + dc
    if not all(0 <= v < lim for v, lim in ((R1, H), (R2, H), (C1, W), (C2, W))): return
    assert score(idx(r1, c1), idx(r2, c2)) == pytest.approx(score(idx(R1, C1), idx(R2, C2)), abs=1e-4)


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match='divisible by 4, got 30'): SinCos2D(4, 30)
    with pytest.raises(ValueError, match='head_dim divisible by 4, got 30'): RoPE2D(4, 30, 2)
    with pytest.raises(ValueError, match="valid: 'none', 'ape', 'spe', 'rope', 'rope_mixed'"): create_pos_embed('abs', 4, 32, 2)
    with pytest.raises(ValueError, match='alpha must be'): LearnedAPE(4, 8).alpha = -0.5
    with pytest.raises(ValueError, match='= 10 tokens, got 11'): LearnedAPE(3, 8)(torch.randn(1, 11, 8))
    with pytest.raises(ValueError, match='grid_size'): NoPE((0, 2))


@pytest.mark.parametrize('pe', PE_NAMES)
def test_alpha_zero_equals_nope_model(pe):
    # with alpha = 0 every PE model computes exactly what the same weights compute with no PE
    torch.manual_seed(0)
    m = timm.create_model('pe_vit_nano_patch1_8', pe=pe).eval()
    ref = timm.create_model('pe_vit_nano_patch1_8', pe='none').eval()
    ref.load_state_dict({k: v for k, v in m.state_dict().items() if not k.startswith('pos_embed.')})
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad(), m.pos_embed.scaled(0.): torch.testing.assert_close(m(x), ref(x), atol=1e-6, rtol=0)


def test_ape_rope_alphas_act_separately():
    m = small_vit('ape_rope')
    x = torch.randn(2, 3, 16, 16)
    ape, rope = small_vit('ape'), small_vit('rope')
    sd = m.state_dict()
    ape.load_state_dict({**{k: v for k, v in sd.items() if not k.startswith('pos_embed.')}, 'pos_embed.pos_embed': sd['pos_embed.ape.pos_embed']})
    rope.load_state_dict({k: v for k, v in sd.items() if not k.startswith('pos_embed.')})
    with torch.no_grad():
        with m.pos_embed.scaled(0., part='rope'): torch.testing.assert_close(m(x), ape(x))     # RoPE off: the APE model
        with m.pos_embed.scaled(0., part='ape'): torch.testing.assert_close(m(x), rope(x))     # table off: the RoPE model
    assert m.pos_embed.alpha_ape == m.pos_embed.alpha_rope == 1.
    m.pos_embed.alpha = .5
    assert m.pos_embed.alpha_ape == m.pos_embed.alpha_rope == .5


def test_resolution_change_resizes_tables():
    m = small_vit('rpb')
    old = m.pos_embed.tables[0].relative_position_bias_table.shape
    m.set_input_size(32)
    assert m.grid_size == (16, 16) and m.pos_embed.tables[0].relative_position_bias_table.shape == ((2 * 16 - 1) ** 2 + 3, old[1])
    assert m(torch.randn(1, 3, 32, 32)).shape == (1, 5)
    a = small_vit('ape'); t0 = a.pos_embed.pos_embed.detach().clone()
    a.set_input_size(32)
    assert a.pos_embed.pos_embed.shape == (1, 1 + 256, 32) and torch.equal(a.pos_embed.pos_embed[:, :1], t0[:, :1])
    r = small_vit('rope_dinov3'); r.set_input_size(32)
    c = r.pos_embed.coords
    assert c.shape == (256, 2) and c.min() > -1 and c.max() < 1
    al = small_vit('alibi'); al.set_input_size(32)
    assert al.pos_embed.attn_bias().shape == (1, 2, 257, 257)


def test_dinov3_coordinate_augmentation_only_in_training():
    m = small_vit('rope_dinov3')
    pe = m.pos_embed
    m.eval(); a0 = pe.base_angles().clone()
    m.train(); torch.manual_seed(1); a1 = pe.base_angles().clone()
    assert not torch.allclose(a0, a1)
    valid = a0.abs() > 1e-3
    ratio = a1[valid] / a0[valid]
    assert torch.allclose(ratio, ratio[0], rtol=1e-4) and ratio[0] != 1                     # one global rescale, no shift
    m.eval(); torch.testing.assert_close(pe.base_angles(), a0)


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


def test_dinov3_draws_per_block():
    x = torch.randn(1, 3, 16, 16)
    m = small_vit('rope_dinov3')                                                   # aug_draw='block', the default
    assert m.pos_embed.aug_draw == 'block'
    r = _block_ropes(m.train(), x)
    assert not torch.equal(r[0], r[1]) and not torch.equal(r[1], r[2])       # training: each block its own draw
    r = _block_ropes(m.eval(), x)
    assert torch.equal(r[0], r[1]) and torch.equal(r[0], r[2])               # evaluation: the same table
    ev = r[0]
    p = small_vit('rope_dinov3', pe_kwargs=dict(aug_draw='pass'))
    r = _block_ropes(p.train(), x)
    assert torch.equal(r[0], r[1]) and torch.equal(r[0], r[2]) and not torch.equal(r[0], ev)   # one draw for the pass
    with pytest.raises(ValueError, match="'block', 'pass'"): small_vit('rope_dinov3', pe_kwargs=dict(aug_draw='layer'))


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
    plain, eva = small_vit(pe), small_vit(pe, pe_kwargs=dict(ref_grid_size=8))                      # 16 px, patch 2: an 8x8 grid
    torch.testing.assert_close(eva.pos_embed.base_angles()[0], plain.pos_embed.base_angles()[0])   # same at the ref grid
    for m in (plain, eva): m.set_input_size(32)                                          # 16x16 grid
    torch.testing.assert_close(plain.pos_embed.base_angles()[0], want(16, 1.))
    torch.testing.assert_close(eva.pos_embed.base_angles()[0], want(16, 8 / 16))
    assert eva(torch.randn(1, 3, 32, 32)).shape == (1, 5)
    late = small_vit(pe); late.pos_embed.ref_grid_size = late.pos_embed.grid_size             # a trained model, resized EVA's way
    late.set_input_size(32)
    torch.testing.assert_close(late.pos_embed.base_angles()[0], want(16, 8 / 16))


@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize('head_dim, per_head', [(4, False), (16, True), (24, False), (48, True)])
def test_apply_rope_is_the_formula_bit_for_bit(dtype, head_dim, per_head):
    """apply_rope: the same floats as x cos + rot(x) sin with rot(x) = [-Q2, Q1, -Q4, Q3] by negating and stacking,
    values and the gradients of x and of the table, on the strided q view the attention passes (a per-head table too)."""
    torch.manual_seed(0)
    H, N = 3, 10
    qkv = torch.randn(2, 1 + N, 3, H, head_dim, dtype=dtype).permute(2, 0, 3, 1, 4)   # (3, B, H, 1+N, D) as Attention
    x = qkv[0][..., 1:, :].requires_grad_()                                            # patch tokens of q: strided
    rope = torch.randn(H if per_head else 1, N, 2 * head_dim, requires_grad=True)      # any [sin | cos] values
    g = torch.randn(2, H, N, head_dim, dtype=dtype)
    def formula(x, rope):
        sin, cos = rope.to(x.dtype).chunk(2, -1)
        u = x.unflatten(-1, (2, 2, -1))
        return x * cos + torch.stack([-u[..., 1, :], u[..., 0, :]], -2).flatten(-3) * sin
    outs = []
    for f in (apply_rope, formula):
        x.grad = rope.grad = None
        y = f(x, rope); (y * g).sum().backward()
        outs.append([y, x.grad, rope.grad])
    for a, b in zip(*outs):
        assert a.dtype == b.dtype and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
    q = torch.arange(4 * 5.).reshape(4, 5)[..., :4]                                    # a strided view
    assert torch.equal(rope_partners(q), q[:, [1, 0, 3, 2]])                           # quarters of 1: [Q2, Q1, Q4, Q3]


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


def test_one_table_of_names_and_classes():
    "`PE_CLASSES` names every PE once; each class takes the part of the backbone's geometry it needs."
    from pe_anchors.pos_embed import PE_CLASSES, PosEmbed, ROPE_LAYOUTS
    assert tuple(PE_CLASSES) == PE_NAMES and len(set(PE_CLASSES.values())) == len(PE_CLASSES)
    for name, cls in PE_CLASSES.items():
        pe = create_pos_embed(name, (4, 6), 32, 2, depth=3)
        assert type(pe) is cls and isinstance(pe, PosEmbed) and pe.grid_size == (4, 6)
        assert (pe.rope_layout in ROPE_LAYOUTS) if pe.rotary else pe.rope_layout is None   # each rotary PE states its layout
        assert (pe.padding_mode is not None) == (name == 'peg')                             # only a PEG has a convolution
    assert create_pos_embed('rope', 4, 32, 2, depth=3).depth == 3 and create_pos_embed('alibi', 4, 32, 2).num_heads == 2


def test_a_peg_is_padded_through_its_own_api():
    from pe_anchors.pos_embed import PEG
    pe = PEG(4, 8)
    x = torch.randn(2, 1 + 16, 8)
    with pe.padded('circular'):
        assert pe.padding_mode == 'circular'
        shifted = lambda t: torch.cat([t[:, :1], t[:, 1:].reshape(2, 4, 4, 8).roll(1, dims=2).reshape(2, 16, 8)], 1)
        torch.testing.assert_close(pe.after_block(shifted(x), 0), shifted(pe.after_block(x, 0)))   # no border: shift-equivariant
    assert pe.padding_mode == 'zeros'
    with pytest.raises(ValueError, match="valid: 'zeros', 'circular'"), pe.padded('torus'): pass
