"""The explorer: similarity maps are rows of the mean cosine-similarity matrix; RPI is read on the index grid."""
import numpy as np
import pytest
import timm
import torch

from pe_anchors.explorer import Explorer
from pe_anchors.hooks import TokenRecorder


def test_similarity_map_equals_brute_force():
    torch.manual_seed(0)
    m = timm.create_model('pe_vit_nano_patch1_8', pe='ape').eval()
    x = torch.randn(6, 3, 8, 8)
    ex = Explorer({'m': m}, [x[:4], x[4:]], max_images=None)
    with torch.no_grad(), TokenRecorder(m, 'ln1') as rec: m(x)
    f = rec.patch_tokens('ln1')[2]                                   # (B, N, C) at block 2
    f = f / f.norm(dim=-1, keepdim=True)
    ref = torch.einsum('bc,bnc->bn', f[:, 19], f).mean(0).reshape(8, 8).numpy()   # token 19 = (2, 3)
    np.testing.assert_allclose(ex.similarity_map('m', 2, (2, 3)), ref, atol=1e-5)
    np.testing.assert_allclose(ex.similarity_map('m', 2, 19), ref, atol=1e-5)
    assert ex.ssdc('m').shape == (4,) and ex.ssdc('m', rpi=True).shape == (4,)
    with pytest.raises(IndexError, match='outside the 8x8 grid'): ex.similarity_map('m', 0, 64)
    with pytest.raises(ValueError, match='at least one model'): Explorer({}, [x])


def test_static_show_draws_figures():
    import matplotlib; matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    plt.close('all')
    m = timm.create_model('pe_vit_nano_patch1_8', pe='none').eval()
    Explorer({'m': m}, [torch.randn(4, 3, 8, 8)]).show(layers=[0, 3])
    assert len(plt.get_fignums()) == 4                                # 2 layers x (normal, RPI)
