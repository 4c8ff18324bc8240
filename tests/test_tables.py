"""pe_anchors.tables: cells against hand computations (statistics.mean / stdev on the written-out numbers); the verdict
table is one table, with its key, wherever a page prints it."""
import importlib.util, json, math, re, statistics as st
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pe_anchors.results import fragility_frame, load_results, result_frame
from pe_anchors.tables import (NBSP, compare_verdicts, determinism_table, md_table, noise_note, rpi_summary, table5, table_alpha,
                               table_rpi, verdict_key, verdict_markdown, verdict_summary, verdict_table)
from pe_anchors.claims import verdicts
from pe_anchors.testing import synthetic_results

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
                             dict(metric='acc', shift='jpeg', severity='paper', alpha=al, value=acc[s] * (1 - fs[s]),
                                  sweep='alpha', **meta),
                             dict(metric='fs', shift='jpeg', severity='paper', alpha=al, value=fs[s], sweep='alpha', **meta)]
    return result_frame(rows)


def ms(values, digits):
    "'m ± sd' as a table cell prints it: never broken across lines."
    return f"{st.mean(values):.{digits}f}{NBSP}±{NBSP}{st.stdev(values):.{digits}f}"


def test_three_seeds_tables_show_mean_and_sd():
    df = three_seeds()
    t5 = table5(df).set_index('condition')
    assert t5.loc['APE', 'seeds'] == 3 and t5.loc['APE', 'clean acc'] == ms(ACC['ape'], 4)
    assert t5.loc['NoPE', 'JPEG FS'] == ms(FS['nope'], 4) and t5.loc['NoPE', 'blur FS'] == ms([f / 2 for f in FS['nope']], 4)
    assert t5.loc['NoPE', 'paper blur FS'] == f'0.2984{NBSP}±{NBSP}0.0085'
    tr = table_rpi(df).set_index('condition')
    assert tr.loc['APE', 'layer 1'] == ms([r[1] for r in RPI['ape']], 3)
    assert tr.loc['APE', 'last layer'] == ms([r[2] for r in RPI['ape']], 3)
    assert tr.loc['APE', 'ΔSSDC'] == ms([r[1] - r[0] for r in RPI['ape']], 3)
    assert tr.loc['APE', 'peak'] == ms([max(r) for r in RPI['ape']], 3) and tr.loc['APE', 'peak layer'] == '1 / 2 / 1'
    assert tr.loc['APE', 'unpermuted, last layer'] == ms([.7 + .01 * s for s in range(3)], 3)
    assert tr.loc['APE', 'anchored'] == 'after block 0' and tr.loc['NoPE', 'anchored'] == 'nowhere'
    ta = table_alpha(df, 'ape').set_index('α')
    for al, (ds, acc, fs) in ALPHA.items():
        row = ta.loc[f"{al:.1f}"]
        assert (row['ΔSSDC (RPI)'], row['clean acc']) == (ms(ds, 4), ms(acc, 4))
        assert row['JPEG FS'] == ms(fs, 4) + (f'{NBSP}†' if st.mean(acc) < .2 else '')
        above = [1 - (a * (1 - f) - .1) / (a - .1) for a, f in zip(acc, fs)]  # FS of the accuracy above chance (1/10)
        assert row['JPEG FS above chance'].startswith(ms(above, 4))
    assert ta.loc['0.1', 'JPEG FS'].endswith('†') and '(2 marked)' in ta.attrs['note']
    assert ta.loc['1.0', 'paper ΔSSDC'] == '0.4725'


def test_every_table_says_what_its_plus_minus_is():
    df = three_seeds()
    assert 'SD over seeds (3 seeds)' in table5(df).attrs['note']
    one = pd.concat([df, df[(df.seed == 0) & (df.condition == 'ape')].assign(condition='peg')], ignore_index=True)
    note = noise_note(one)
    assert 'PEG: one seed' in note and 'pooled over the multi-seed conditions' in note
    alone = df[df.seed == 0]
    assert 'no ±' in noise_note(alone)
    assert table5(alone).set_index('condition').loc['APE', 'clean acc'] == f"{ACC['ape'][0]:.4f}"   # nothing made up


def test_table5_states_the_shifts_here_and_in_the_paper():
    note = table5(three_seeds(), shifts={'jpeg/paper': 'JPEG quality 5', 'blur/paper': 'Gaussian blur σ=1.25 px'}).attrs['note']
    assert 'Gaussian blur σ=1.25 px' in note and 'at 224 px' in note


def test_fragility_frame_is_consistent():
    fr = fragility_frame(synthetic_results(seeds=(0, 1)))
    np.testing.assert_allclose(fr['fs'], 1 - fr['acc'] / fr['acc_clean'], atol=1e-9)


def test_verdict_tables_keep_tests_and_sanity_checks_apart():
    v = verdicts(synthetic_results(seeds=(0, 1, 2)))
    t, s = verdict_table(v, 'test'), verdict_table(v, 'sanity check')
    assert len(t) + len(s) == len(v) and 'why a sanity check' in s and 'why a sanity check' not in t
    assert set(s['claim']) == set(v[v.kind == 'sanity check']['claim'])
    r = v[v.id == 'pe-helps'].iloc[0]
    cell = t[t.claim == r['claim']]
    assert cell['ours [interval]'].iloc[0] == f"{r['effect']:+.3f} [{r['ci_low']:+.3f}, {r['ci_high']:+.3f}]".replace(' ', NBSP)
    assert cell['deciding part'].iloc[0] == r['part'] and cell["the paper's"].iloc[0] == f"{r['paper_effect']:+.3f}"
    assert cell['Holm p'].iloc[0] == f"{r['p_holm']:.2g}".lstrip('0') or r['p_holm'] < .001


def test_verdict_markdown_is_caption_table_and_key():
    df = three_seeds()
    v = verdicts(df)
    md = verdict_markdown(df, v=v)
    cap, table, key = md.split('\n\n')
    m = int(v[v.kind == 'test']['p'].notna().sum())
    assert cap == f"**Tests of the paper's claims** (hand, seeds 0–2; {int((v.kind == 'test').sum())} claims, Holm over the {m} with a p):"
    assert table == md_table(verdict_table(v)) and key == verdict_key(v, df)
    assert f"adjusted over the {m} claims" in key and 'never gives p below .25' in key       # 3 seeds: 2/2³
    assert 'nan' not in md.lower() and 'p = <' not in md
    assert verdict_summary(v).startswith(f"Of the {int((v.kind == 'test').sum())} tests:")


def test_md_table_writes_a_missing_value_as_a_dash():
    assert md_table(pd.DataFrame({'a': [1., math.nan], 'b': ['x', None]})) == '| a | b |\n|---|---|\n| 1.0 | x |\n| – | – |'


def test_determinism_table_shows_the_largest_difference_per_run():
    rt = pd.DataFrame([dict(run='nope-s0', stage='trained', metric='ssdc', mode='normal', max_abs_diff=.0213, where='nope s0 layer 3',
                            trained_on='CPU (2 cores, 1 torch threads)', committed_on='CPU (2 cores, 2 torch threads)'),
                       dict(run='nope-s0', stage='trained', metric='ssdc', mode='rpi', max_abs_diff=.0011, where='x',
                            trained_on='CPU (2 cores, 1 torch threads)', committed_on='CPU (2 cores, 2 torch threads)'),
                       dict(run='nope-s0', stage='trained', metric='acc', mode='normal', max_abs_diff=.004, where='y',
                            trained_on='CPU (2 cores, 1 torch threads)', committed_on='CPU (2 cores, 2 torch threads)'),
                       dict(run='ape-s1', stage='trained', metric='acc', mode='normal', max_abs_diff=0., where='',
                            trained_on='CPU (2 cores, 1 torch threads)', committed_on='CPU (2 cores, 1 torch threads)')])
    t = determinism_table(rt).set_index('run')
    assert t.loc['nope-s0', 'ssdc'] == '0.021' and t.loc['nope-s0', 'largest'] == '0.021'      # the max over modes, not the mean
    assert t.loc['nope-s0', 'where'] == 'nope s0 layer 3' and t.loc['nope-s0', 'torch threads'] == '2 → 1'
    assert t.loc['ape-s1', 'largest'] == '0' and t.loc['ape-s1', 'where'] == '–'


ROOT = Path(__file__).resolve().parents[1]


def _page_text(nb_path: Path) -> str:
    "Everything a page prints as markdown or text."
    out = []
    for c in json.loads(nb_path.read_text())['cells']:
        for o in c.get('outputs', []):
            for k in ('text/markdown', 'text/plain'):
                v = o.get('data', {}).get(k)
                if v: out.append(''.join(v) if isinstance(v, list) else v)
            if 'text' in o: out.append(''.join(o['text']))
    return '\n'.join(out)


def _readme_links(md: str) -> str:
    "Links as tools/make_readme.py writes them into README.md."
    spec = importlib.util.spec_from_file_location('make_readme', ROOT / 'tools' / 'make_readme.py')
    mr = importlib.util.module_from_spec(spec); spec.loader.exec_module(mr)
    site = mr.site_url()
    return re.sub(r'\]\((?!https?:|#)([^)]+)\)', lambda m: mr._link(m, site), md)


@pytest.mark.parametrize('experiment, places', [
    ('cifar10-cpu', ('nbs/10d_tables.ipynb', 'nbs/20_reproduce.ipynb', 'nbs/index.ipynb', 'README.md')),
    ('digits', ('nbs/20_reproduce.ipynb',))])
def test_every_page_prints_the_same_verdict_table(experiment, places):
    "The verdict table of a committed experiment, with its key, as `verdict_markdown` makes it now, on every page that shows it."
    df = load_results(ROOT / 'nbs' / 'results' / experiment / 'results.csv')
    want = verdict_markdown(df)
    bad = []
    for place in places:
        p = ROOT / place
        text, expect = (p.read_text(), _readme_links(want)) if p.suffix == '.md' else (_page_text(p), want)
        if expect not in text: bad.append(place)
    assert not bad, (f"{experiment}: the verdict table (verdict_markdown, with its key) is not printed as now computed on "
                     f"{bad}: re-run them (python tools/run_notebooks.py ...; README: python tools/make_readme.py)")


def test_compare_verdicts_side_by_side():
    df = three_seeds()
    c = compare_verdicts(df[df.seed == 0], df, labels=('one seed', 'three seeds'))
    assert list(c.columns) == ['id', 'verdict (one seed)', 'verdict (three seeds)', 'kind (one seed)', 'kind (three seeds)', 'changed']
    a, b = verdicts(df[df.seed == 0]).set_index('id'), verdicts(df).set_index('id')
    for r in c.itertuples():
        assert (getattr(r, '_2'), getattr(r, '_3')) == (a.loc[r.id, 'verdict'], b.loc[r.id, 'verdict'])
    with pytest.raises(ValueError, match='labels must be two different names'): compare_verdicts(df, df, labels=('a', 'a'))


def test_rpi_summary_lines():
    lines = rpi_summary(three_seeds())
    assert lines[0].strip().startswith('APE: ΔSSDC') and 'anchored after block 0' in lines[0] and 'SD over seeds' in lines[-1]
    assert rpi_summary(three_seeds().query("mode == 'normal'")) == []


def test_md_table():
    assert md_table(pd.DataFrame({'a': [1], 'b': ['x|y']})) == '| a | b |\n|---|---|\n| 1 | x\\|y |'
