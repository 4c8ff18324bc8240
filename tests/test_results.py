"""The results table's derived rows (the peak of each RPI curve) and the chance rule for FS, on written-out examples."""
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pe_anchors.results import (DATASET_CLASSES, PEAK_METRIC, chance_level, gather, load_results, near_chance, peak_rpi,
                                read_results, result_frame, with_peak_rpi, write_results)
from pe_anchors.results import concat_results

ROOT = Path(__file__).resolve().parents[1]


def curve(values, metric='ssdc', mode='rpi', **kw):
    "Rows of one SSDC curve, layer 0, 1, ... holding `values`."
    return [dict(metric=metric, mode=mode, layer=layer, value=v, **kw) for layer, v in enumerate(values)]


def peaks_of(df):
    return peak_rpi(df).set_index(['condition', 'seed', 'stage', 'mode', 'alpha'])[['layer', 'value', 'metric']]


def test_peak_is_the_largest_layer_and_where_it_is():
    t = result_frame(curve([.01, .10, .30, .20]) + curve([.9, .9, .9, .9], mode='normal')    # unpermuted rows: not RPI
                     + [dict(metric='delta_ssdc', mode='rpi', value=.09)], condition='nope', seed=0)
    p = peak_rpi(t)
    assert len(p) == 1
    assert (p['metric'].item(), p['layer'].item(), p['value'].item(), p['mode'].item()) == (PEAK_METRIC, 2, .30, 'rpi')


def test_a_tie_goes_to_the_shallowest_layer_and_negative_curves_peak_at_their_largest():
    t = result_frame(curve([.1, .4, .2, .4]), condition='ape')
    assert peak_rpi(t)['layer'].item() == 1
    t = result_frame(curve([-.03, -.01, -.02]), condition='nope')          # signed maximum, not the largest |value|
    assert (peak_rpi(t)['layer'].item(), peak_rpi(t)['value'].item()) == (1, -.01)


def test_one_peak_per_seed_stage_alpha_and_mode_never_mixed():
    rows = []
    for seed, vals in ((0, [.0, .2, .5, .1]), (1, [.0, .6, .4, .1]), (2, [.0, .1, .2, .3])):
        rows += curve(vals, condition='ape', seed=seed)
        rows += curve([.8, 0, 0, 0], condition='ape', seed=seed, stage='untrained')           # would win if mixed in
    rows += [{**r, 'sweep': 'alpha'} for r in curve([.05, .9, 0, 0], condition='ape', seed=0, alpha=.5)]
    rows += curve([.0, .0, .7, .0], metric='ssdc_image', mode='rpi_image', condition='ape', seed=0)
    rows += curve([.0, .0, .0, .99], metric='ssdc', mode='rpi_image', condition='ape', seed=0)  # not rpi_image's metric
    p = peaks_of(result_frame(rows))
    want = {(0, 'trained', 'rpi', 1.): (2, .5), (1, 'trained', 'rpi', 1.): (1, .6), (2, 'trained', 'rpi', 1.): (3, .3),
            (0, 'untrained', 'rpi', 1.): (0, .8), (1, 'untrained', 'rpi', 1.): (0, .8), (2, 'untrained', 'rpi', 1.): (0, .8),
            (0, 'trained', 'rpi', .5): (1, .9), (0, 'trained', 'rpi_image', 1.): (2, .7)}
    got = {k[1:]: (int(r.layer), float(r.value)) for k, r in p.iterrows()}
    assert got == want
    alpha_peak = peak_rpi(result_frame(rows)).query('alpha == .5')
    assert alpha_peak['sweep'].item() == 'alpha'                          # an α row's peak stays an α-sweep row


def test_the_peak_row_is_a_copy_of_its_layer_row():
    rows = [dict(r, sd=.01 * i, n_perms=8, n_images=100) for i, r in enumerate(curve([.1, .3, .2]))]
    t = result_frame(rows, condition='ape')
    p, layer = peak_rpi(t).iloc[0], t[t.layer == 1].iloc[0]
    pd.testing.assert_series_equal(p.drop('metric'), layer.drop('metric'), check_names=False)
    assert p['sd'] == .01


def test_derived_once_however_often_loaded(tmp_path):
    t = result_frame(curve([.1, .3, .2]) + curve([.1, .1, .1], stage='untrained'), condition='ape')
    once = with_peak_rpi(t)
    assert len(once) == len(t) + 2 and len(with_peak_rpi(once)) == len(once)
    write_results(once, tmp_path / 'with.csv'); write_results(t, tmp_path / 'without.csv')
    for f in ('with.csv', 'without.csv'):                                # a CSV written before the peaks, or after
        got = load_results(tmp_path / f)
        assert (got.metric == PEAK_METRIC).sum() == 2, f
        assert len(read_results(tmp_path / f)) == (len(once) if f == 'with.csv' else len(t))   # the raw reader adds nothing
    assert with_peak_rpi(t.iloc[:0]).empty and with_peak_rpi(result_frame([dict(metric='acc', value=.5)])).shape[0] == 1


def test_gather_writes_the_derived_rows_and_the_runs_keep_theirs_raw(tmp_path):
    for c in ('ape', 'nope'):
        write_results(result_frame(curve([.0, .4, .2]), condition=c), tmp_path / 'runs' / f'{c}-s0' / 'results.csv')
    df = gather(tmp_path)
    assert (df.metric == PEAK_METRIC).sum() == 2
    assert len(read_results(tmp_path / 'results.csv')) == 8                # 2 runs × 3 layers + 2 peaks, written
    assert len(load_results(tmp_path / 'results.csv')) == 8                # and read back without a second copy
    assert len(read_results(tmp_path / 'runs' / 'ape-s0' / 'results.csv')) == 3


@pytest.mark.parametrize('path', sorted((ROOT / 'nbs' / 'results').glob('*/results.csv')), ids=lambda p: p.parent.name)
def test_committed_tables_get_one_peak_per_rpi_curve(path):
    "Every committed results table has one peak per RPI curve, over the block inputs: against a plain loop."
    df = load_results(path)
    raw = read_results(path)
    want = {}
    for r in raw.itertuples():
        if str(getattr(r, 'tap', 'nan')) == 'output': continue                          # the output tap is read apart
        if r.mode in ('rpi', 'rpi_image') and r.layer >= 0 and r.metric == {'rpi': 'ssdc', 'rpi_image': 'ssdc_image'}[r.mode]:
            key = (r.condition, r.seed, r.stage, r.mode, r.alpha, str(getattr(r, 'sweep', 'nan')))
            best = want.get(key)
            if best is None or r.value > best[1] or (r.value == best[1] and r.layer < best[0]): want[key] = (r.layer, r.value)
    got = {(r.condition, r.seed, r.stage, r.mode, r.alpha, str(getattr(r, 'sweep', 'nan'))): (r.layer, r.value)
           for r in df[df.metric == PEAK_METRIC].itertuples()}
    assert got == want and len(got) == (df.metric == PEAK_METRIC).sum()


def test_chance_level_and_the_margin():
    assert chance_level(num_classes=10) == .1 and chance_level(num_classes=100) == .01
    assert chance_level(result_frame([dict(metric='acc', value=.5)], dataset='cifar10')) == .1
    assert np.isnan(chance_level(result_frame([dict(metric='acc', value=.5)], dataset='somewhere')))
    assert np.isnan(chance_level(pd.concat([result_frame([dict(metric='acc', value=.5)], dataset=d)
                                            for d in ('cifar10', 'imagenet100')])))              # two datasets: no one K
    for bad in (1, 0, 2.5):
        with pytest.raises(ValueError, match=f'num_classes must be an integer >= 2, got {bad}'): chance_level(num_classes=bad)
    # the margin: one chance level above chance (FS capped below 1/2 there), for K = 10 and K = 100
    acc = np.array([.05, .1, .1999, .2, .5])
    assert list(near_chance(acc, .1)) == [True, True, True, False, False]
    assert list(near_chance(acc, .01)) == [False] * 5
    cap = 1 - .1 / acc                                                    # FS's ceiling when the shift leaves chance
    assert list(near_chance(acc, .1)) == list(cap < .5)
    assert not near_chance(.11, float('nan')) and list(near_chance([.3], .1, factor=4)) == [True]


def test_dataset_classes_agree_with_the_data_module():
    from pe_anchors.data import CIFAR10_CLASSES, IMAGENET100_WNIDS, DATASETS
    assert set(DATASET_CLASSES) <= set(DATASETS)
    assert DATASET_CLASSES['cifar10'] == len(CIFAR10_CLASSES) and DATASET_CLASSES['imagenet100'] == len(IMAGENET100_WNIDS)
    from sklearn.datasets import load_digits
    assert DATASET_CLASSES['digits'] == len(np.unique(load_digits().target))


def test_result_tables_of_one_experiment_over_seeds_combine():
    "The committed tables read back whole, and a table of other seeds of the same experiment joins them."
    for p in sorted((ROOT / 'nbs' / 'results').glob('*/results.csv')):
        df = read_results(p)
        assert len(df) > 0 and df['seed'].dtype.kind == 'i' and df['value'].dtype.kind == 'f', p
    committed = read_results(ROOT / 'nbs' / 'results' / 'cifar10-cpu' / 'results.csv')
    seed0 = committed[committed['seed'] == 0]
    more = pd.concat([seed0.assign(seed=7), seed0.assign(seed=8)], ignore_index=True)
    both = concat_results({'committed': committed, 'new': more})
    assert set(both['seed']) == set(committed['seed']) | {7, 8} and len(both) == len(committed) + 2 * len(seed0)
    with pytest.raises(ValueError, match='duplicate result rows'):                # the same seed twice is refused
        concat_results({'committed': committed, 'again': seed0})


def test_read_table_checks_any_written_table(tmp_path):
    "`read_table` reads back what `write_results` wrote, whatever its columns, and refuses an edited copy."
    from pe_anchors.results import read_table
    df = pd.DataFrame(dict(condition=['ape', 'rope'], layer=[0, 3], test_acc=[.25, .5]))
    p = write_results(df, tmp_path / 'probes.csv')
    pd.testing.assert_frame_equal(read_table(p), df)
    p.write_text(p.read_text().replace('0.5', '0.6'))
    with pytest.raises(ValueError, match='checksum'): read_table(p)


def test_peak_is_over_block_inputs_not_the_output_tap():
    "The peak RPI-SSDC is the largest value over the block inputs; a larger value at the output tap is not the peak."
    rows = [dict(experiment='e', dataset='digits', condition='ape', seed=0, stage='trained', metric='ssdc', mode='rpi',
                 layer=l, shift='', severity='', alpha=1.0, value=v, tap='output' if l == 3 else np.nan)
            for l, v in ((0, .1), (1, .4), (2, .3), (3, .9))]
    p = peak_rpi(pd.DataFrame(rows))
    assert len(p) == 1 and p['layer'].item() == 1 and p['value'].item() == .4
