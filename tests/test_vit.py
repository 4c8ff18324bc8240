"""pe_anchors.vit: the registry, the paper's ViT-S, the block's rotation and attention bias against written-out
formulas, tables built once per pass, conv q/k/v projections, the released style and timm's API."""
import math

import pytest
import torch
import timm

import pe_anchors  # noqa: F401
import pe_anchors.vit
from pe_anchors.core import CONDITIONS
from pe_anchors.pos_embed import PE_CLASSES, PE_NAMES
from pe_anchors.vit import PEViT, MODEL_CONFIGS
from pe_anchors.hooks import TokenRecorder
from pe_anchors.hub import save_checkpoint, load_checkpoint

from conftest import sharpen, small_vit


def _axial_rotation(t, grid, theta=10000.):
    "Axial 2D RoPE written out for patch tokens (..., H*W, D) in row-major order: in each half, channel i pairs with i + n."
    (H, W), D = grid, t.shape[-1]
    n, out = D // 4, t.clone()
    for tok in range(H * W):
        y, x = divmod(tok, W)
        for half, coord in ((0, x), (1, y)):                      # quarters 1-2 turn by x theta_i, quarters 3-4 by y theta_i
            for i in range(n):
                a = coord * theta ** (-i / n)
                i1, i2 = 2 * n * half + i, 2 * n * half + n + i
                u1, u2 = t[..., tok, i1], t[..., tok, i2]
                out[..., tok, i1], out[..., tok, i2] = u1 * math.cos(a) - u2 * math.sin(a), u2 * math.cos(a) + u1 * math.sin(a)
    return out


def _dropout_census(m):
    "Name -> p of every dropout site of a PEViT (modules whose p is above 0)."
    return {n: mod.p for n, mod in m.named_modules() if isinstance(mod, torch.nn.Dropout) and mod.p > 0}


def test_registry_lists_models():
    names = timm.list_models('pe_*')
    assert set(MODEL_CONFIGS) <= set(names)


def test_paper_vit_s_parameter_count():
    # written out independently of the model code: see nbs/02_vit.ipynb for the breakdown
    C, T, cls = 384, 197, 100
    block = 4 * C + (3 * C * C + 3 * C) + (C * C + C) + (4 * C * C + 4 * C) + (4 * C * C + C)
    expected = 3 * 256 * C + C + C + T * C + 12 * block + C * cls + cls
    m = timm.create_model('pe_vit_small_patch16_224', pe='ape', num_classes=cls)
    assert sum(p.numel() for p in m.parameters()) == expected == 21_703_396
    assert m.pos_embed.pos_embed.shape == (1, 197, 384)
    assert m.blocks[0].attn.num_heads == 8 and m.blocks[0].attn.head_dim == 48
    assert isinstance(m.norm, torch.nn.Identity)


@pytest.mark.parametrize('pe', PE_NAMES)
def test_paper_config_forward_and_taps(pe):
    m = timm.create_model('pe_vit_small_patch16_224', pe=pe, num_classes=10).eval()
    with torch.no_grad(), TokenRecorder(m, 'ln1') as rec: out = m(torch.randn(2, 3, 224, 224))
    assert out.shape == (2, 10)
    assert rec.patch_tokens().shape == (12, 2, 196, 384)


@pytest.mark.parametrize('pe', ['rope', 'ape_rope'])
def test_block_rotation_equals_written_out_formula(pe):
    "The rotation a block applies to q and k (inside its attention, the table the model hands it) is the axial formula."
    torch.manual_seed(0)
    m = timm.create_model('pe_vit_nano_patch1_8', pe=pe).eval()             # 8x8 grid, 4 heads of 16, 4 blocks
    with torch.no_grad():
        for blk in m.blocks: blk.attn.qkv.weight.mul_(10)                    # attention far from uniform
    blk, seen = m.blocks[2], {}
    hooks = [blk.norm1.register_forward_hook(lambda mod, i, o: seen.__setitem__('h', o)),
             blk.attn.register_forward_hook(lambda mod, i, o: seen.__setitem__('out', o))]
    with torch.no_grad(): m(torch.randn(2, 3, 8, 8))
    for h in hooks: h.remove()
    attn, h = blk.attn, seen['h']
    with torch.no_grad():
        q, k, v = attn.rotated_qkv(h)                                       # no table: the plain projections
        qf, kf = (torch.cat([t[..., :1, :], _axial_rotation(t[..., 1:, :], (8, 8))], -2) for t in (q, k))  # CLS kept
        want = attn.proj((torch.softmax(qf @ kf.transpose(-2, -1) / math.sqrt(16), -1) @ v).transpose(1, 2).reshape(2, 65, 64))
        torch.testing.assert_close(seen['out'], want, atol=1e-5, rtol=1e-5)  # what the block computed in the forward pass
        rq, rk, _ = attn.rotated_qkv(h, m.pos_embed.rope(2))
    torch.testing.assert_close(rq, qf, atol=1e-5, rtol=1e-5); torch.testing.assert_close(rk, kf, atol=1e-5, rtol=1e-5)
    assert (qf - q).abs().max() > .1 and torch.equal(rq[..., 0, :], q[..., 0, :])


def _rotation_by_the_formula(x, rope):
    "x cos + rot(x) sin with rot(x) = [-Q2, Q1, -Q4, Q3] built by negating and stacking the quarters of x as it comes."
    *lead, n_tok, d = x.shape
    sin, cos = rope.to(x.dtype).chunk(2, -1)
    u = x.reshape(*lead, n_tok, 2, 2, d // 4)                                # (..., N, half, member, n)
    return x * cos + torch.stack([-u[..., 1, :], u[..., 0, :]], dim=-2).reshape(*lead, n_tok, d) * sin


_ROTARY = {f"{pe}{' ' + str(kw) if kw else ''}": (pe, kw) for pe, kw in       # every rotary PE and condition, once
           [(pe, {}) for pe in PE_NAMES] + [(s['pe'], s.get('model_kwargs', {})) for s in CONDITIONS.values()]
           if PE_CLASSES[pe].rotary}


@pytest.mark.parametrize('model', ['pe_vit_nano_patch4_32', 'pe_vit_tiny_patch4_32'])    # head_dim 16 and 48
@pytest.mark.parametrize('pe, kw', _ROTARY.values(), ids=_ROTARY.keys())
def test_rotary_training_pass_is_the_formula_bit_for_bit(pe, kw, model, monkeypatch):
    "A training-mode forward and backward pass gives the same bits, logits and every gradient, as with the rotation computed by the formula (1 thread)."
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    def run():
        torch.manual_seed(0)
        m = timm.create_model(model, pe=pe, **kw).train()
        with torch.no_grad():                                                # weights away from their init (zero biases)
            for p in m.parameters(): p.add_(torch.randn(p.shape) * .05)
        x = torch.randn(4, 3, 32, 32, requires_grad=True)
        torch.manual_seed(1)                                                 # drop-path and DINOv3's coordinate draws
        y = m(x)
        (y * torch.randn(y.shape)).sum().backward()
        return [y, x.grad] + [p.grad for p in m.parameters()]
    try:
        ours = run()
        monkeypatch.setattr(pe_anchors.vit, 'apply_rope', _rotation_by_the_formula)
        ref = run()
    finally: torch.set_num_threads(threads)
    assert len(ours) == len(ref) and all(g is not None for g in ours[2:])
    bits = lambda t: t.contiguous().view(torch.int32)
    for a, b in zip(ours, ref): assert torch.equal(bits(a), bits(b))


@pytest.mark.parametrize('pe, pe_kwargs, per_block', [('rope', {}, False), ('ape_rope', {}, False), ('rope_dinov3', {}, False),
                                                      ('alibi', {}, False), ('rpb', dict(shared=True), False),
                                                      ('rpb', {}, True), ('rope_mixed', {}, True)])
def test_pe_tables_built_once_per_pass(pe, pe_kwargs, per_block):
    "A table that is the same in every block is built once per forward pass and handed to all blocks (timm's Eva)."
    m = timm.create_model('pe_vit_nano_patch1_8', pe=pe, pe_kwargs=pe_kwargs).eval()
    key = 'rope' if m.pos_embed.rotary else 'attn_bias'
    build, calls, got = getattr(m.pos_embed, key), [], {}
    setattr(m.pos_embed, key, lambda layer=0: calls.append(layer) or build(layer))
    hooks = [b.register_forward_pre_hook(lambda mod, a, kw, i=i: got.__setitem__(i, kw[key]), with_kwargs=True)
             for i, b in enumerate(m.blocks)]
    with torch.no_grad(): m(torch.randn(2, 3, 8, 8))
    for h in hooks: h.remove()
    assert calls == (list(range(4)) if per_block else [0])
    if per_block: assert not any(torch.equal(got[0], got[i]) for i in (1, 2, 3))
    else: assert all(got[i] is got[0] for i in range(4))
    with torch.no_grad(): m.forward_intermediates(torch.randn(2, 3, 8, 8), indices=[1], stop_early=True)
    assert calls[-1] == (1 if per_block else 0)                              # the blocks run, no more


def test_attention_with_a_bias_against_a_written_out_softmax():
    m = sharpen(small_vit('rpb'))
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


def test_conv_qkv_matches_brute_force_loop():
    "Each q/k/v input of a patch token is the BN of a zero-padded depthwise 3x3 sum over its grid neighbours."
    from pe_anchors.vit import ConvQKV
    torch.manual_seed(0)
    h, w, C, k = 3, 4, 5, 3
    m = ConvQKV(C, (h, w), k, num_prefix_tokens=1).eval()
    with torch.no_grad():
        m.norm.running_mean.normal_(); m.norm.running_var.uniform_(.5, 2); m.norm.weight.normal_(); m.norm.bias.normal_()
    x = torch.randn(2, 1 + h * w, C)
    out = m(x)
    W, bn = m.conv.weight.detach(), m.norm
    for b in range(2):
        for s in range(3):
            assert torch.equal(out[s, b, 0], x[b, 0])                     # the CLS token passes through
            for r in range(h):
                for c in range(w):
                    for ch in range(C):
                        acc = 0.
                        for dr in range(k):
                            for dc in range(k):
                                rr, cc = r + dr - k // 2, c + dc - k // 2
                                if 0 <= rr < h and 0 <= cc < w:
                                    acc += W[3 * ch + s, 0, dr, dc].item() * x[b, 1 + rr * w + cc, ch].item()
                        o = 3 * ch + s
                        want = (acc - bn.running_mean[o].item()) / math.sqrt(bn.running_var[o].item() + bn.eps) \
                            * bn.weight[o].item() + bn.bias[o].item()
                        assert out[s, b, 1 + r * w + c, ch].item() == pytest.approx(want, rel=1e-4, abs=1e-5)


def test_conv_qkv_branches_feed_q_k_v():
    "A 1x1 kernel scaling branch s (q, k, v) by s+1 with identity BN: patch tokens get (s+1) W_s x + b_s, CLS W_s x + b_s."
    from pe_anchors.vit import Attention
    torch.manual_seed(0)
    C, H = 32, 4
    lin = Attention(C, H).eval()
    conv = Attention(C, H, qkv_proj='conv', grid_size=(2, 3), qkv_kernel=1).eval()
    conv.load_state_dict({**conv.state_dict(), **lin.state_dict()})
    scale = torch.tensor([1., 2., 3.])
    with torch.no_grad():
        conv.conv_qkv.conv.weight.copy_(scale.repeat(C).view(3 * C, 1, 1, 1))    # output channel 3c + s -> s + 1
        conv.conv_qkv.norm.eps = 0.
    x = torch.randn(2, 7, C)
    with torch.no_grad():
        got, plain = conv._qkv(x), lin._qkv(x)                                  # (3, B, H, N, D)
        scaled = lin._qkv(x * 0) + (lin._qkv(x) - lin._qkv(x * 0)) * scale.view(3, 1, 1, 1, 1)   # (s+1) W x + b
    torch.testing.assert_close(got[..., 1:, :], scaled[..., 1:, :], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got[..., :1, :], plain[..., :1, :], rtol=1e-5, atol=1e-6)


def test_conv_qkv_round_trip_and_training_step(tmp_path):
    torch.manual_seed(0)
    m = timm.create_model('pe_vit_nano_patch2_16', pe='spe', qkv_proj='conv', qkv_kernel=5)
    loss = m(torch.randn(4, 3, 16, 16)).logsumexp(-1).mean()
    loss.backward()
    assert m.blocks[0].attn.conv_qkv.conv.weight.grad.abs().sum() > 0
    m.eval()
    p = save_checkpoint(m, tmp_path / 'conv.safetensors')
    m2 = load_checkpoint(p).eval()
    assert m2.qkv_proj == 'conv' and m2.blocks[0].attn.conv_qkv.kernel_size == 5
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad(): assert torch.equal(m(x), m2(x))


def test_released_style_init_statistics():
    # The released model: PyTorch-default linears (uniform +-1/sqrt(fan_in), biases too), CLS and APE ~ N(0, 1).
    torch.manual_seed(0)
    m = PEViT(img_size=32, patch_size=4, embed_dim=128, depth=2, num_heads=4, num_classes=10, pe='ape', style='released')
    w, b = m.blocks[0].mlp.fc1.weight, m.blocks[0].mlp.fc1.bias            # fan_in 128
    bound = 1 / math.sqrt(128)
    assert w.abs().max() <= bound and abs(w.std().item() - bound / math.sqrt(3)) < .05 * bound / math.sqrt(3)
    assert b.abs().max() <= bound and b.abs().mean() > bound / 4           # non-zero biases
    assert abs(m.pos_embed.pos_embed.std().item() - 1) < .05 and abs(m.cls_token.std().item() - 1) < .2
    t = PEViT(img_size=32, patch_size=4, embed_dim=128, depth=2, num_heads=4, num_classes=10, pe='ape')
    assert t.blocks[0].mlp.fc1.bias.abs().max() == 0 and abs(t.blocks[0].mlp.fc1.weight.std().item() - .02) < .002
    assert abs(t.pos_embed.pos_embed.std().item() - .02) < .002 and t.cls_token.abs().max() < 1e-4
    s = PEViT(img_size=32, patch_size=4, embed_dim=128, depth=2, num_heads=4, pe='spe', style='released')
    assert abs(s.pos_embed.prefix_pos.std().item() - 1) < .2


def test_released_style_dropout_sites():
    kw = dict(img_size=32, patch_size=4, embed_dim=64, depth=2, num_heads=4, drop_rate=.15, pe='ape')
    timm_sites = _dropout_census(PEViT(**kw))
    released = _dropout_census(PEViT(**kw, style='released'))
    per_block = lambda sites: sorted({n.split('.', 2)[2] for n in sites if n.startswith('blocks.')})
    assert per_block(timm_sites) == ['attn.attn_drop', 'attn.proj_drop', 'mlp.drop1', 'mlp.drop2']
    assert per_block(released) == ['attn.attn_drop', 'mlp.drop1']        # attention weights, MLP hidden layer
    assert 'pos_drop' in released and set(released.values()) == {.15}
    with pytest.raises(ValueError, match="unknown model style 'torch'"): PEViT(**kw, style='torch')


def test_timm_api_forward_intermediates_matches_the_recorder_taps():
    torch.manual_seed(0)
    m = timm.create_model('pe_vit_nano_patch1_8', pe='rope').eval()
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad(), TokenRecorder(m, 'block') as rec: m(x)
    with torch.no_grad(): final, inter = m.forward_intermediates(x, output_fmt='NLC')
    torch.testing.assert_close(torch.stack(inter), rec.patch_tokens('block'))
    torch.testing.assert_close(final, m.forward_features(x))
    with torch.no_grad(): grid = m.forward_intermediates(x, indices=[1], intermediates_only=True)[0]
    torch.testing.assert_close(grid, rec.patch_tokens('block')[1].reshape(2, 8, 8, -1).permute(0, 3, 1, 2))
    fx = timm.create_model('pe_vit_nano_patch1_8', pe='ape', features_only=True, out_indices=(1, 3))
    assert [tuple(t.shape) for t in fx(x)] == [(2, 64, 8, 8)] * 2 and len(fx.model.blocks) == 4


def test_timm_api_checkpointing_pooling_and_layer_decay():
    from timm.optim import create_optimizer_v2
    torch.manual_seed(0)
    m = timm.create_model('pe_vit_nano_patch1_8', pe='ape').train()
    x = torch.randn(2, 3, 8, 8)
    torch.manual_seed(1); ref = m(x)
    m.set_grad_checkpointing(); torch.manual_seed(1); out = m(x)
    torch.testing.assert_close(out, ref)                                      # same maths, recomputed in backward
    out.sum().backward(); assert m.blocks[0].attn.qkv.weight.grad is not None
    opt = create_optimizer_v2(m, 'adamw', lr=1e-3, layer_decay=.5)
    scales = sorted({g['lr_scale'] for g in opt.param_groups})
    assert len(scales) == len(m.blocks) + 2 and scales[-1] == 1.0            # stem, 4 blocks, head
    m.reset_classifier(3, global_pool='avg'); m.eval()
    with torch.no_grad(): feats = m.forward_features(x)
    torch.testing.assert_close(m.forward_head(feats, pre_logits=True), feats[:, 1:].mean(1))


def test_reset_classifier_checkpoint_round_trip(tmp_path):
    m = timm.create_model('pe_vit_nano_patch1_8', pe='spe')
    m.reset_classifier(3)
    save_checkpoint(m, tmp_path / 'm.safetensors')
    back = load_checkpoint(tmp_path / 'm.safetensors')
    assert back.num_classes == 3 and back.head.out_features == 3
    assert all(torch.equal(v, back.state_dict()[k]) for k, v in m.state_dict().items())
    m2 = timm.create_model('pe_vit_nano_patch1_8', pretrained_cfg_overlay=dict(mean=(.5, .5, .5)))
    assert m2.pretrained_cfg['mean'] == (.5, .5, .5)
