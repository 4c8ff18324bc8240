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
        7: lambda d: d.assign(value=np.where((d.condition == 'nope') & (d.metric == 'fs'), .2, d.value)),  # below APE
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


def test_verdicts_check_preconditions_and_noise(df):
    # an APE that never anchored: the alpha claims cannot "collapse" anything, whatever the sweep looks like
    flat = df.assign(value=np.where((df.get('sweep') == 'alpha') & (df.metric == 'delta_ssdc'), .02, df.value))
    v = verdicts(flat)
    assert list(v.loc[[11, 12], 'verdict']) == ['not testable'] * 2 and 'not anchored at α = 1' in v.loc[11, 'ours']
    # NoPE and APE fragility within each other's seed spread: neither yes nor no
    fs_ape = df[(df.metric == 'fs') & (df.condition == 'ape') & df['sweep'].isna()].set_index(['seed', 'shift'])['value']
    close = df.copy()
    m = (close.metric == 'fs') & (close.condition == 'nope') & close['sweep'].isna()
    close.loc[m, 'value'] = [fs_ape[(s, k)] + .001 for s, k in zip(close.loc[m, 'seed'], close.loc[m, 'shift'])]
    assert verdicts(close).loc[7, 'verdict'] == 'inconclusive'
    # a shift that does nothing: fragility claims are not testable
    quiet = df.assign(value=np.where((df.metric == 'fs') & df['sweep'].isna(), 0., df.value))
    assert set(verdicts(quiet).loc[[7, 8, 9], 'verdict']) == {'not testable'}


def test_single_seed_noise_is_the_binomial_standard_error():
    from pe_anchors.report import _acc_measure, _fs_measure
    one = synthetic_results(seeds=(0,))
    a = _acc_measure(one, 'ape')
    assert a.n_seeds == 1 and a.spread == pytest.approx(np.sqrt(a.mean * (1 - a.mean) / 5000))
    f = _fs_measure(one, 'ape')
    d = one[(one.condition == 'ape') & one['sweep'].isna() & (one.metric == 'acc')].set_index('shift')['value']
    As, Ac = d['jpeg'], d['clean']
    se = lambda p: np.sqrt(p * (1 - p) / 5000)
    assert f.spread == pytest.approx(np.sqrt(se(As) ** 2 / Ac ** 2 + As ** 2 * se(Ac) ** 2 / Ac ** 4))


@pytest.mark.parametrize('conds', [['ape'], ['nope'], ['rpt'], ['rope', 'spe'], ['nope', 'rpt'], ['ape', 'rpt']])
def test_report_on_subsets_of_conditions(tmp_path, df, conds):
    # every figure, table and verdict is drawn from what exists; what is missing is said, not crashed on
    p = write_report(df[df.condition.isin(conds)], tmp_path, title='subset')
    text = p.read_text()
    assert 'Verdicts' in text and (tmp_path / 'results.csv').exists()
    assert 'n/a' in text                                                    # claims about absent conditions


def test_report_from_a_csv_with_its_meta(tmp_path, df):
    from pe_anchors.results import write_results
    import json
    write_results(df, tmp_path / 'r' / 'results.csv')
    (tmp_path / 'r' / 'meta.json').write_text(json.dumps(dict(
        experiment=dict(name='from-csv', data='cifar10', data_kwargs=dict(path='/secret/place/cifar.npz'), model='m',
                        recipe='fast', train_kwargs={}, ssdc_images=10, n_perms=2, rpi_mode='rpi'),
        runs=[dict(hardware='CPU x', train_and_init_s=60., eval_s=30.)])))
    text = write_report(tmp_path / 'r' / 'results.csv', tmp_path / 'out').read_text()
    assert 'from-csv' in text and 'cifar.npz' in text and '/secret/place' not in text and 'CPU x' in text


def test_fig3_names_the_experiment_not_ours(df):
    "The fragility panels are titled with the experiment they show, so synthetic data can never read as 'ours'."
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    from pe_anchors.report import fig3
    fig = fig3(df)
    titles = [a.get_title() for a in fig.axes]
    plt.close(fig)
    assert titles[:2] == ['blur (synthetic)', 'JPEG (synthetic)'] and titles[2:] == ['blur (paper)', 'JPEG (paper)']
    assert not any('ours' in t for t in titles)
