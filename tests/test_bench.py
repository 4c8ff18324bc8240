"""Benchmarks (pe_anchors.bench): each runs at toy size and prints its figures; no timing is asserted. The GPU check's
CPU smoke mode runs every step, so the script a GPU session runs cannot rot."""
import json

import pytest
import timm
import torch

from pe_anchors.bench import bench_shifts, bench_ssdc, bench_train, bench_vs_timm, gpu_check, timm_twins


def test_bench_runs_small_and_paths_agree(capsys):
    r = bench_ssdc(n_images=10, n_tokens=16, n_layers=2, dim=8, batch_size=4)
    out = capsys.readouterr().out
    assert 'speed-up' in out and 'naive' in out and r['max_abs_diff'] < 1e-5
    assert r['mem_keep_all_features_mb'] > 0 and r['n_images'] == 10
    with pytest.raises(ValueError, match='not square'): bench_ssdc(n_tokens=20, verbose=False)


def test_bench_train_reports_all_paths():
    df = bench_train('pe_vit_nano_patch1_8', bs=16, steps=2, warmup=1, pes=('ape', 'rope'),
                     model_kwargs=dict(depth=1), verbose=False)
    assert list(df.path) == ['plain', 'learner', 'learner', 'learner']
    assert list(df.rpt) == [False, False, True, False] and list(df.pe) == ['ape', 'ape', 'ape', 'rope']
    assert (df.img_s > 0).all() and df.vs_plain[0] == 1.0 and df.vs_learner_ape[1] == 1.0
    assert set(df.attrs['vs_timm']['ms']) == {'ape', 'vit', 'rope', 'eva'}        # ends with ours vs timm's twins


def test_bench_vs_timm_ratios_are_the_step_times(capsys):
    r = bench_vs_timm('pe_vit_nano_patch1_8', bs=4, rounds=2, warmup=1, model_kwargs=dict(depth=1), num_threads=1)
    out = capsys.readouterr().out
    assert 'RoPE / Eva' in out and 'APE / ViT' in out and '1 torch threads' in out and r['threads'] == 1
    for t, ratios in ((r['ms'], r), (r['cpu_ms'], r['cpu'])):                 # speed ours / timm = time timm / time ours
        assert all(v > 0 for v in t.values())
        assert ratios['rope_vs_eva'] == pytest.approx(t['eva'] / t['rope']) and ratios['ape_vs_vit'] == pytest.approx(t['vit'] / t['ape'])


@pytest.mark.parametrize('kw', [{}, dict(depth=2, embed_dim=32, num_heads=2, drop_path_rate=.1, final_norm=True)])
def test_timm_twins_have_our_size(kw):
    "timm's ViT and Eva built for a PEViT config hold exactly its parameter count, geometry and final norm."
    twins = timm_twins('pe_vit_nano_patch1_8', kw)
    count = lambda m: sum(p.numel() for p in m.parameters())
    for pe, twin in (('ape', twins['vit']), ('rope', twins['eva'])):
        ours = timm.create_model('pe_vit_nano_patch1_8', pe=pe, num_classes=10, **kw)
        assert count(twin) == count(ours) and len(twin.blocks) == len(ours.blocks)
        assert twin.blocks[0].attn.num_heads == ours.num_heads and tuple(twin.patch_embed.grid_size) == tuple(ours.grid_size)
        assert isinstance(twin.norm, torch.nn.LayerNorm) == isinstance(ours.norm, torch.nn.LayerNorm)   # final norm
    assert twins['eva'].pos_embed is None and twins['eva'].rope is not None
    with pytest.raises(ValueError, match='no twin'): timm_twins('pe_vit_nano_patch1_8', dict(qkv_proj='conv'))


def test_bench_shifts_runs(capsys):
    res = bench_shifts(n_images=8, img_size=32, batch_size=4, repeats=1)
    out = capsys.readouterr().out
    assert 'img/s' in out and 'PIL' in out and res['n_images'] == 8
    assert all(v > 0 for k, v in res.items() if k.endswith('[cpu]'))


def test_bench_train_with_a_timm_baseline():
    df = bench_train('pe_vit_nano_patch1_8', bs=8, steps=1, warmup=1, pes=('ape',), model_kwargs=dict(depth=1),
                     baseline='vit_tiny_patch16_224', baseline_kwargs=dict(img_size=8, patch_size=1, embed_dim=64, depth=1,
                                                                           num_heads=4), verbose=False)
    assert df.path[1] == 'timm vit_tiny_patch16_224' and df.vs_timm[1] == 1.0 and (df.img_s > 0).all()


def test_gpu_check_smoke_on_cpu(tmp_path):
    s = gpu_check(tmp_path, smoke=True, device='cpu')
    assert all(v['ok'] for v in s['steps'].values()), s['steps']
    saved = json.loads((tmp_path / 'summary.json').read_text())
    assert saved['device'] == 'cpu' and set(saved['steps']) == {'experiment', 'bench_train_eager', 'bench_ssdc'}
    assert (tmp_path / 'gpu-check-smoke' / 'results.csv').exists() and (tmp_path / 'bench_train_eager.csv').exists()
    assert set(s['steps']['experiment']['result']['accuracy']) == {'ape', 'nope'}
