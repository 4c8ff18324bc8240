"""The report: tables against hand computations, verdicts that can fail, files written."""
import numpy as np
import pandas as pd
import pytest

from pe_anchors.report import (synthetic_results, table5, table_alpha, verdicts, write_report, fragility_frame, md_table,
                               PAPER_ALPHA)


@pytest.fixture(scope='module')
def df(): return synthetic_results(seeds=(0, 1, 2))


def test_table5_mean_sd_match_hand_computation(df):
    t = table5(df).set_index('condition')
    d = df[(df.metric == 'fs') & (df['shift'] == 'jpeg') & (df.condition == 'rope') & df['sweep'].isna()]['value']
    assert t.loc['RoPE', 'JPEG FS'] == f"{d.mean():.4f} ± {np.std(d, ddof=1):.4f}"
    assert t.loc['NoPE', 'paper blur FS'] == '0.2984 ± 0.0085'


def test_alpha_table(df):
    t = table_alpha(df, 'ape')
    assert list(t['α']) == [f"{a:.1f}" for a in PAPER_ALPHA['ape']['alpha']]
    assert t.iloc[0]['paper ΔSSDC'] == '0.4725'


def test_fragility_frame_is_consistent(df):
    fr = fragility_frame(df)
    np.testing.assert_allclose(fr['fs'], 1 - fr['acc'] / fr['acc_clean'], atol=1e-9)


def test_verdicts_detect_each_broken_claim(df):
    assert set(verdicts(df)['verdict']) == {'yes'}
    flips = {
        0: lambda d: d.assign(value=np.where((d.condition == 'nope') & (d['mode'] == 'rpi'), .2, d.value)),
        4: lambda d: d.assign(value=np.where((d.condition == 'rope') & (d['mode'] == 'rpi') & (d.layer == 0), .3, d.value)),
        7: lambda d: d.assign(value=np.where((d.condition == 'nope') & (d.metric == 'fs'), 0., d.value)),
        11: lambda d: d.assign(value=np.where((d.get('sweep') == 'alpha') & (d.metric == 'delta_ssdc'), .3, d.value)),
    }
    for i, f in flips.items(): assert verdicts(f(df.copy())).loc[i, 'verdict'] == 'no', i
    assert verdicts(df[df.condition != 'rope']).loc[8, 'verdict'] == 'n/a'


def test_write_report(tmp_path, df):
    p = write_report(df, tmp_path, title='t')
    text = p.read_text()
    for f in ('fig1', 'fig2', 'fig3', 'fig4', 'fig5', 'fig_alpha'):
        assert (tmp_path / 'figures' / f'{f}.png').exists() and (tmp_path / 'figures' / f'{f}.svg').exists()
        assert f'figures/{f}.png' in text
    assert '<table' in (tmp_path / 'report.html').read_text()


def test_md_table():
    assert md_table(pd.DataFrame({'a': [1], 'b': ['x|y']})) == '| a | b |\n|---|---|\n| 1 | x\\|y |'
