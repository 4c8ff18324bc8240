"""The report: tables against hand computations, verdicts that can fail, files written."""
import numpy as np
import pandas as pd
import pytest

from pe_anchors.report import (synthetic_results, table5, table_alpha, table_rpi, verdicts, write_report, fragility_frame,
                               md_table, PAPER_ALPHA)


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


# ---------------------------------------------------------------- several seeds, peaks, chance: written-out examples
import json
import statistics as st

from pe_anchors.results import result_frame, write_results

RPI = {'ape': [[.02, .40, .30], [.00, .50, .55], [.01, .45, .35]],     # per seed, layers 0-2: peaks at 1, 2, 1
       'nope': [[.00, .01, .00], [.00, .00, .02], [.01, .00, .00]]}
PLAIN = {'ape': [.5, .6, .7], 'nope': [.4, .5, .6]}                    # + .01 × seed
ACC = {'ape': [.70, .72, .74], 'nope': [.60, .61, .65]}
FS = {'ape': [.40, .42, .44], 'nope': [.55, .60, .62]}                  # JPEG; blur is half of it
ALPHA = {1.: ([.38, .50, .44], [.70, .72, .74], [.40, .42, .44]),       # α: ΔSSDC, clean acc, JPEG FS per seed
         .5: ([.20, .25, .30], [.50, .55, .60], [.50, .52, .54]),
         .1: ([.00, .01, .02], [.15, .16, .17], [.20, .25, .30])}       # clean acc near chance (10 classes: < .2)


def three_seeds() -> pd.DataFrame:
    "A hand-made 3-seed table (APE, NoPE; 3 layers), every number written out above."
    rows = []
    for c in ('ape', 'nope'):
        for s in range(3):
            meta = dict(condition=c, seed=s, dataset='cifar10', experiment='hand')
            rpi = RPI[c][s]
            rows += [dict(metric='ssdc', mode='rpi', layer=l, value=v, sd=.02, n_perms=4, **meta) for l, v in enumerate(rpi)]
            rows += [dict(metric='ssdc', mode='normal', layer=l, value=v + .01 * s, **meta) for l, v in enumerate(PLAIN[c])]
            rows.append(dict(metric='delta_ssdc', mode='rpi', value=rpi[1] - rpi[0], sd=.02, n_perms=4, **meta))
            a, f = ACC[c][s], FS[c][s]
            rows.append(dict(metric='acc', shift='clean', value=a, n_images=1000, **meta))
            for kind, ff in (('jpeg', f), ('blur', f / 2)):
                rows.append(dict(metric='acc', shift=kind, severity='paper', value=a * (1 - ff), n_images=1000, **meta))
                rows.append(dict(metric='fs', shift=kind, severity='paper', value=ff, n_images=1000, **meta))
            if c == 'ape':
                for al, (ds, acc, fs) in ALPHA.items():
                    rows += [dict(metric='delta_ssdc', mode='rpi', alpha=al, value=ds[s], sweep='alpha', **meta),
                             dict(metric='acc', shift='clean', alpha=al, value=acc[s], sweep='alpha', **meta),
                             dict(metric='fs', shift='jpeg', severity='paper', alpha=al, value=fs[s], sweep='alpha', **meta)]
    return result_frame(rows)


def ms(values, digits):
    return f"{st.mean(values):.{digits}f} ± {st.stdev(values):.{digits}f}"


def test_three_seeds_tables_show_mean_and_sd():
    df = three_seeds()
    t5 = table5(df).set_index('condition')
    assert t5.loc['APE', 'seeds'] == 3 and t5.loc['APE', 'clean acc'] == ms(ACC['ape'], 4)
    assert t5.loc['NoPE', 'JPEG FS'] == ms(FS['nope'], 4) and t5.loc['NoPE', 'blur FS'] == ms([f / 2 for f in FS['nope']], 4)
    tr = table_rpi(df).set_index('condition')
    assert tr.loc['APE', 'layer 1'] == ms([r[1] for r in RPI['ape']], 3)
    assert tr.loc['APE', 'last layer'] == ms([r[2] for r in RPI['ape']], 3)
    assert tr.loc['APE', 'ΔSSDC'] == ms([r[1] - r[0] for r in RPI['ape']], 3)
    assert tr.loc['APE', 'peak'] == ms([max(r) for r in RPI['ape']], 3) and tr.loc['APE', 'peak layer'] == '1 / 2 / 1'
    assert tr.loc['NoPE', 'peak layer'] == '1 / 2 / 0'
    assert tr.loc['APE', 'unpermuted, last layer'] == ms([.7 + .01 * s for s in range(3)], 3)
    ta = table_alpha(df, 'ape').set_index('α')
    for al, (ds, acc, fs) in ALPHA.items():
        row = ta.loc[f"{al:.1f}"]
        assert (row['ΔSSDC (RPI)'], row['clean acc']) == (ms(ds, 4), ms(acc, 4))
        assert row['JPEG FS'] == ms(fs, 4) + (' †' if st.mean(acc) < .2 else '')
    assert ta.loc['0.1', 'JPEG FS'].endswith('†') and '1 value(s) marked' in ta.attrs['note'] and '0.200' in ta.attrs['note']


def test_three_seeds_figures_draw_mean_and_sd_bands():
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    from pe_anchors.report import fig2, fig_alpha
    df = three_seeds()

    def line_and_band(ax, label):
        i = [l.get_label() for l in ax.lines].index(label)
        line = ax.lines[i]
        ys = np.concatenate([p.vertices[:, 1] for p in ax.collections[i].get_paths()])   # one band per line, in order
        return line.get_xdata(), line.get_ydata(), ys

    fig = fig2(df)
    x, y, band = line_and_band(fig.axes[0], 'APE')
    mean = np.mean(RPI['ape'], axis=0); sd = np.std(RPI['ape'], axis=0, ddof=1)
    np.testing.assert_allclose(y, mean)
    for lo, hi in zip(mean - sd, mean + sd): assert np.isclose(band, lo).any() and np.isclose(band, hi).any()
    plt.close(fig)
    fig = fig_alpha(df)
    x, y, band = line_and_band(fig.axes[1], 'APE')                        # JPEG FS against α
    fs = {al: v[2] for al, v in ALPHA.items()}
    np.testing.assert_allclose(x, sorted(fs)); np.testing.assert_allclose(y, [st.mean(fs[a]) for a in sorted(fs)])
    for a in fs: assert np.isclose(band, st.mean(fs[a]) + st.stdev(fs[a])).any()
    crossed = [l for l in fig.axes[1].lines if l.get_marker() == 'x']
    assert len(crossed) == 1 and list(crossed[0].get_xdata()) == [.1]         # the near-chance α, crossed out
    plt.close(fig)


def test_three_seeds_verdicts_use_the_seed_spread():
    from pe_anchors.report import _fs_measure, _order
    df = three_seeds()
    a, n = _fs_measure(df, 'ape'), _fs_measure(df, 'nope')
    assert (a.n_seeds, a.mean, a.spread) == (3, pytest.approx(st.mean(FS['ape'])), pytest.approx(st.stdev(FS['ape'])))
    assert _order(n, a) == 1 and verdicts(df).loc[7, 'verdict'] == 'yes'  # .59 ± .036 vs .42 ± .02: separated
    wide = df.copy()                                                        # NoPE's seeds far apart: the same mean, within noise
    m = (wide.condition == 'nope') & (wide.metric == 'fs') & (wide['shift'] == 'jpeg')
    wide.loc[m, 'value'] = [.40, .60, .77]
    assert verdicts(wide).loc[7, 'verdict'] == 'inconclusive'
    assert verdicts(wide[wide.seed == 0]).loc[7, 'verdict'] == 'inconclusive'    # and one seed, .40 vs .40, likewise


def test_compare_verdicts_side_by_side():
    from pe_anchors.report import compare_verdicts
    df = three_seeds()
    wide = df.copy()
    wide.loc[(wide.condition == 'nope') & (wide.metric == 'fs') & (wide['shift'] == 'jpeg'), 'value'] = [.70, .45, .46]
    one, three = wide[wide.seed == 0], wide
    c = compare_verdicts(one, three)
    assert list(c.columns) == ['claim', 'paper', 'verdict (one seed)', 'verdict (three seeds)', 'changed',
                               'ours (one seed)', 'ours (three seeds)']
    assert list(c['verdict (one seed)']) == list(verdicts(one)['verdict'])
    assert list(c['verdict (three seeds)']) == list(verdicts(three)['verdict'])
    assert (c.loc[7, 'verdict (one seed)'], c.loc[7, 'verdict (three seeds)'], c.loc[7, 'changed']) == ('yes', 'inconclusive', 'yes')
    assert set(c['changed']) <= {'yes', ''} and (c['changed'] == 'yes').sum() == (c['verdict (one seed)'] != c['verdict (three seeds)']).sum()
    with pytest.raises(ValueError, match='labels must be two different names'): compare_verdicts(one, three, labels=('a', 'a'))


def test_table_rpi_one_seed_peak_with_its_standard_error():
    t = result_frame([dict(metric='ssdc', mode='rpi', layer=l, value=v, sd=.04, n_perms=16) for l, v in enumerate([.0, .1, .3, .2])]
                     + [dict(metric='ssdc', mode='rpi', layer=l, value=.9, stage='untrained') for l in range(4)],
                     condition='nope', dataset='cifar10')
    r = table_rpi(t).iloc[0]
    assert (r['peak'], r['peak layer'], r['ΔSSDC']) == ('0.300 ± 0.010', '2', '–')          # SE = .04 / √16
    from pe_anchors.report import rpi_summary
    lines = rpi_summary(t)
    assert lines[0] == "NoPE: ΔSSDC –, peak RPI-SSDC 0.300 ± 0.010 at layer 2 (of 0–3)" and 'standard error' in lines[-1]
    assert rpi_summary(three_seeds())[-1] == '(±: SD over 3 seeds)' and rpi_summary(t[t['mode'] == 'normal']) == []


def test_fs_verdicts_leave_out_models_near_chance(df):
    # NoPE at 1.5 % clean accuracy on 100 classes (chance 1 %): its FS means nothing, so the orderings are not testable
    low = df.copy()
    low.loc[(low.condition == 'nope') & (low.metric == 'acc') & (low['shift'] == 'clean') & low['sweep'].isna(), 'value'] = .015
    v = verdicts(low, num_classes=100)
    assert list(v.loc[[7, 9], 'verdict']) == ['not testable'] * 2 and 'not meaningful near chance' in v.loc[7, 'ours']
    assert '0.020' in v.loc[7, 'ours'] and v.loc[8, 'verdict'] == 'yes'      # RoPE vs APE, SPE: NoPE is not in it
    assert verdicts(low).loc[7, 'verdict'] == 'yes'                          # chance unknown ('synthetic'): nothing left out
    assert table5(low, num_classes=100).set_index('condition').loc['NoPE', 'JPEG FS'].endswith('†')
    # the α-FS claim: α = .2 and .1 near chance, with FS collapsed there only because accuracy did
    sw = df[df['sweep'] == 'alpha'].query("metric == 'fs'")
    acc = sw.assign(metric='acc', shift='clean', severity='', value=np.where(sw.alpha <= .2, .015, .6))
    near = pd.concat([df, acc], ignore_index=True)
    near.loc[(near['sweep'] == 'alpha') & (near.metric == 'fs') & (near.alpha <= .2), 'value'] = 0.
    assert verdicts(near).loc[12, 'verdict'] == 'no'                         # taken at face value the claim fails
    v = verdicts(near, num_classes=100).loc[12]
    assert v['verdict'] == 'yes' and 'α = 0.2, 0.1 left out' in v['ours']


def test_report_of_an_experiment_file_without_newer_fields(tmp_path, df):
    "An experiment.json (or meta.json) written before rpi_mode and other fields existed reads them as their defaults."
    from pe_anchors.core import N_PERMS
    from pe_anchors.experiment import Experiment
    from pe_anchors.report import EXPERIMENT_DEFAULTS, report_meta
    defaults = Experiment.defaults()
    assert {k: defaults[k] for k in EXPERIMENT_DEFAULTS} == EXPERIMENT_DEFAULTS
    write_results(df, tmp_path / 'r' / 'results.csv')
    old = dict(name='old', data='cifar10', model='m', recipe='fast', train_kwargs={}, ssdc_images=10, n_perms=2)
    (tmp_path / 'r' / 'meta.json').write_text(json.dumps(dict(experiment=old, runs=[dict(hardware='CPU x', eval_s=30.)])))
    text = write_report(tmp_path / 'r' / 'results.csv', tmp_path / 'out').read_text()
    assert 'RPI averaged over 2 permutation draws (rpi)' in text and 'CPU x' in text
    (tmp_path / 'd').mkdir()
    (tmp_path / 'd' / 'experiment.json').write_text(json.dumps(dict(name='old')))
    m = report_meta(tmp_path / 'd')
    assert m['experiment']['rpi_mode'] == 'rpi' and m['experiment']['n_perms'] == N_PERMS and m['experiment']['name'] == 'old'
