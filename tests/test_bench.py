"""Benchmarks (pe_anchors.bench): each runs at toy size and prints its figures; no timing is asserted. The GPU check's
CPU smoke mode runs every step, so the script a GPU session runs cannot rot."""
import json

import pytest

from pe_anchors.bench import bench_shifts, bench_ssdc, bench_train, gpu_check


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
