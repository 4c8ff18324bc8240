"""pe_anchors.claims: verdicts that can fail, the test each quantity's design calls for, the deciding part of a conjunction,
Holm over a table's claims, the paper's effect and the paper's own reading, sanity checks apart, preconditions, missing
measurements named."""
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from pe_anchors.claims import (ANCHOR_MARGIN, CLAIMS, CLAIM_IDS, RPT_LIKE_SHARE, _paper_reading, _verdict, anchoring, evaluate,
                               paper_table5_results, split_verdicts, verdicts)
from pe_anchors.paper import PAPER_TABLE5
from pe_anchors.stats import holm
from pe_anchors.results import result_frame
from pe_anchors.testing import synthetic_results


@pytest.fixture(scope='module')
def syn(): return synthetic_results(seeds=(0, 1, 2))


def by_id(v): return v.set_index('id')


def test_claims_are_data_with_unique_ids_and_the_papers_evidence():
    from pe_anchors.paper import PAPER_TABLE5, PAPER_ALPHA
    assert len(CLAIM_IDS) == len(set(CLAIM_IDS)) and {'spe-alpha-fs', 'nope-fragile-blur', 'rope-robust-jpeg'} <= set(CLAIM_IDS)
    c = {x.id: x for x in CLAIMS}
    assert f"{PAPER_TABLE5['nope'][1][0]:.4f}" in c['nope-fragile-jpeg'].paper()             # read from paper.py
    assert f"{PAPER_ALPHA['spe']['fs_jpeg'][-1]:g}" in c['spe-alpha-fs'].paper()


def test_the_synthetic_table_follows_the_paper(syn):
    v = by_id(verdicts(syn))
    for i in ('rpt-no-anchoring', 'ape-after-block0', 'rope-gradual', 'nope-fragile-jpeg', 'rope-robust-jpeg',
              'pe-helps', 'ape-alpha-delta', 'ape-alpha-fs', 'nope-training-drop'):
        assert v.loc[i, 'raw'] == 'yes', (i, v.loc[i, 'evidence'])
        assert v.loc[i, 'verdict'] in ('consistent', "smaller than the paper's", "larger than the paper's"), i


def flip(df, cond, metric, value, **kw):
    m = (df.condition == cond) & (df.metric == metric) & (df.stage == 'trained') & df['sweep'].isna()
    for k, x in kw.items(): m &= df[k] == x
    out = df.copy(); out.loc[m, 'value'] = value
    return out


def test_each_claim_fails_when_its_data_contradict_it(syn):
    cases = {
        'ape-after-block0': flip(syn, 'ape', 'ssdc', .45, mode='rpi', layer=0),          # anchored at the input instead
        'rope-gradual': flip(syn, 'rope', 'ssdc', .3, mode='rpi', layer=0),
        'nope-fragile-jpeg': flip(syn, 'nope', 'fs', .2, shift='jpeg'),                   # NoPE far below APE
        'pe-helps': flip(syn, 'rope', 'acc', .4, shift='clean'),
    }
    for cid, d in cases.items():
        v = by_id(verdicts(d))
        assert (v.loc[cid, 'raw'], v.loc[cid, 'side'], v.loc[cid, 'verdict']) == ('no', 'against', 'contradicts'), cid


def test_paired_by_seed_decides_what_welch_cannot():
    "Seed-level chance shared by two conditions (same draws): the paired difference removes it, the means do not."
    chance = [-.02, .01, .03]
    rows = []
    for c, shift in (('nope', 0.), ('spe', .04)):
        for s, ch in enumerate(chance):
            rows += [dict(condition=c, seed=s, metric='ssdc', mode='rpi', layer=l, value=ch + shift + .001 * s, dataset='x')
                     for l in range(3)]
    t = result_frame(rows)
    r = evaluate(next(c for c in CLAIMS if c.id == 'spe-at-input'), t)
    a, b = np.array(chance) + .04 + .001 * np.arange(3), np.array(chance) + .001 * np.arange(3)
    assert r['test'] == 'paired t' and r['verdict'] == 'yes'
    assert stats.ttest_ind(a, b, equal_var=False).pvalue > .05                 # Welch on the same numbers: undecided


def test_a_claim_that_passes_before_training_is_a_sanity_check():
    def table(untrained_spe):
        rows = []
        for stage, spe in (('trained', [.78, .80, .76]), ('untrained', untrained_spe)):
            for c, vals in (('spe', spe), ('nope', [.0, .01, -.01])):
                rows += [dict(condition=c, seed=s, stage=stage, metric='ssdc', mode='rpi', layer=l, value=x, dataset='x')
                         for s, x in enumerate(vals) for l in range(3)]
        return result_frame(rows)
    fixed = by_id(verdicts(table([.60, .58, .59])))                           # a fixed table: there at initialisation
    assert (fixed.loc['spe-at-input', 'raw'], fixed.loc['spe-at-input', 'untrained'], fixed.loc['spe-at-input', 'kind']) \
        == ('yes', 'yes', 'sanity check')
    assert fixed.loc['spe-at-input', 'reason'] == 'passes on the untrained models already'
    learned = by_id(verdicts(table([.0, .01, -.01])))
    assert learned.loc['spe-at-input', 'kind'] == 'test'
    assert learned.loc['nope-rpi-null', 'kind'] == 'sanity check' and 'permutation-equivariant' in learned.loc['nope-rpi-null', 'reason']
    v = verdicts(table([.60, .58, .59]))
    tests, sane = split_verdicts(v)
    assert "spe-at-input" not in set(tests["id"]) and "spe-at-input" in set(sane["id"])


def test_missing_measurements_are_named_not_caught(syn):
    v = by_id(verdicts(syn[syn.condition != 'rpt']))
    assert v.loc['rpt-no-anchoring', 'verdict'] == 'n/a' and 'RPT: RPI-SSDC at layer 0' in v.loc['rpt-no-anchoring', 'evidence']
    assert v.loc['spe-alpha-fs', 'verdict'] == 'n/a' and 'α sweep' in v.loc['spe-alpha-fs', 'evidence']


def test_alpha_claims_need_anchoring_at_one_not_a_delta_threshold(syn):
    # the APE anchored at the input (ΔSSDC small, peak large): the α claims are testable
    d = flip(syn, 'ape', 'ssdc', .5, mode='rpi')
    v = by_id(verdicts(d))
    assert v.loc['ape-alpha-fs', 'verdict'] != 'not testable'
    # an APE with no index anchoring at all: nothing to scale away
    none = flip(flip(syn, 'ape', 'ssdc', 0., mode='rpi'), 'ape', 'peak_ssdc', 0.)
    none = none[none.metric != 'peak_ssdc']
    v = by_id(verdicts(none))
    assert v.loc['ape-alpha-fs', 'verdict'] == 'not testable' and 'no index anchoring at α = 1' in v.loc['ape-alpha-fs', 'evidence']


def test_fragility_near_chance_is_not_testable(syn):
    low = flip(syn, 'nope', 'acc', .015, shift='clean')
    v = by_id(verdicts(low, num_classes=100))
    assert v.loc['nope-fragile-jpeg', 'verdict'] == 'not testable' and 'near chance' in v.loc['nope-fragile-jpeg', 'evidence']
    assert v.loc['rope-robust-jpeg', 'raw'] == 'yes'                         # NoPE is not in it


def _welch_tost(a, b, m):
    a, b = np.asarray(a), np.asarray(b)
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    se, df = math.sqrt(va + vb), (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    e = a.mean() - b.mean()
    return max(stats.t.sf((e + m) / se, df), stats.t.sf((m - e) / se, df))


def fs_table(fs, acc=None):
    rows = []
    for c, vals in fs.items():
        for s, f in enumerate(vals):
            m = dict(condition=c, seed=s, dataset='cifar10')
            rows += [dict(metric='acc', shift='clean', value=(acc or {}).get(c, [.7] * 3)[s], **m),
                     dict(metric='fs', shift='jpeg', severity='paper', value=f, **m)]
    return result_frame(rows)


def test_rpt_like_nope_is_an_equivalence_test_against_half_the_gap():
    fs = dict(ape=[.40, .42, .44], nope=[.60, .62, .61], rpt=[.61, .60, .62])
    r = evaluate(next(c for c in CLAIMS if c.id == 'rpt-like-nope-jpeg'), fs_table(fs))
    margin = RPT_LIKE_SHARE * abs(np.mean(fs['nope']) - np.mean(fs['ape']))
    p = _welch_tost(fs['rpt'], fs['nope'], margin)                          # FS: the same images for every run, Welch
    assert r['verdict'] == ('yes' if p < .05 else 'inconclusive') and f"±{margin:.3f}" in r['evidence']
    ape = stats.ttest_ind(fs['rpt'], fs['ape'], equal_var=False).pvalue   # the other half: RPT above APE
    assert r['p'] == pytest.approx(max(p, ape)) and r['test'] == 'Welch t'    # both must hold: the weaker decides


def test_fragility_and_accuracy_take_welchs_test():
    "A shared seed effect that pairing would remove: accuracy and FS are measured on the same images for every run, so Welch."
    acc = dict(ape=[.70, .75, .65], nope=[.64, .69, .595], spe=[.71, .76, .66], rope=[.72, .77, .67])
    t = fs_table({c: [.5] * 3 for c in acc}, acc)
    r = evaluate(next(c for c in CLAIMS if c.id == 'pe-helps'), t)
    assert r['test'] == 'Welch t'
    welch = [stats.ttest_ind(acc[c], acc['nope'], equal_var=False).pvalue for c in ('ape', 'spe', 'rope')]
    assert r['p'] == pytest.approx(max(welch))                              # the weakest of the three decides
    assert stats.ttest_rel(acc['spe'], acc['nope']).pvalue < .001 and r['verdict'] == 'inconclusive'


def test_a_conjunction_shows_the_part_that_decides():
    fs = dict(rope=[.50, .52, .51], ape=[.50, .53, .50], spe=[.44, .46, .45])     # RoPE ≈ APE, above SPE
    r = evaluate(next(c for c in CLAIMS if c.id == 'rope-robust-jpeg'), fs_table(fs))
    assert (r['side'], r['part'], r['verdict']) == ('against', 'RoPE − SPE JPEG FS', 'no')
    assert r['p'] == pytest.approx(stats.ttest_ind(fs['rope'], fs['spe'], equal_var=False).pvalue)
    assert r['paper'] == pytest.approx(PAPER_TABLE5['rope'][1][0] - PAPER_TABLE5['spe'][1][0])


def test_a_part_that_holds_before_training_does_not_decide(syn):
    "RPT ≈ NoPE under RPI already holds at initialisation: the half that can fail, RPT below APE, is shown."
    v = by_id(verdicts(syn))
    assert v.loc['rpt-no-anchoring', 'part'] == 'RPT − APE peak RPI-SSDC'
    assert '(holds at initialisation)' in v.loc['rpt-no-anchoring', 'evidence']


def test_holm_over_the_claims_of_each_kind(syn):
    v = verdicts(syn)
    for kind, g in v.groupby('kind'):
        np.testing.assert_allclose(g['p_holm'], holm(g['p'].to_numpy()), equal_nan=True)
        assert set(g['family']) == {int(g['p'].notna().sum())}


def row(**kw):
    base = dict(raw='yes', side='for', want='>', ci_low=.1, ci_high=.3, paper_effect=math.nan, margin=math.nan,
                p_holm=.01, paper_reading='')
    return {**base, **kw}


@pytest.mark.parametrize('kw, word', [
    (dict(paper_effect=.2), 'consistent'),                                   # decided, the paper's effect inside
    (dict(), 'consistent'),                                                  # decided, no paper value
    (dict(paper_effect=.5), "smaller than the paper's"),                     # decided, ours below the paper's
    (dict(paper_effect=.05), "larger than the paper's"),
    (dict(side='against', ci_low=-.3, ci_high=-.1), 'contradicts'),
    (dict(p_holm=.2, ci_low=-.1, ci_high=.3, paper_effect=.5), "smaller than the paper's"),   # not decided, size excluded
    (dict(p_holm=.2, ci_low=-.1, ci_high=.3, paper_effect=.2), 'inconclusive'),
    (dict(paper_effect=.2, paper_reading='not decided'), 'departure'),      # the paper's own table does not show it
    (dict(want='≈', ci_low=-.02, ci_high=.02, margin=.04, paper_effect=-.056), 'departure'),
    (dict(want='≈', ci_low=-.02, ci_high=.02, margin=.04, paper_effect=.01), 'consistent'),
    (dict(want='<', ci_low=-.3, ci_high=-.1, paper_effect=-.5), "smaller than the paper's"),   # a '<' claim, mirrored
    (dict(raw='not testable'), 'not testable'),
])
def test_the_verdict_words(kw, word):
    assert _verdict(row(**kw)) == word


def test_the_papers_own_table_read_by_the_same_rule():
    p5 = paper_table5_results()
    for c, ((am, asd), (jm, jsd), _) in PAPER_TABLE5.items():
        g = p5[(p5.condition == c) & (p5.metric == 'fs') & (p5['shift'] == 'jpeg')]['value']
        assert g.mean() == pytest.approx(jm) and g.std() == pytest.approx(jsd)
    v = by_id(verdicts(p5, claims=[c for c in CLAIMS if c.group == 'fragility'], paper=False))
    (rm, rs), (nm, ns), (am, as_) = (PAPER_TABLE5[c][2] for c in ('rpt', 'nope', 'ape'))
    r = stats.ttest_ind_from_stats(rm, rs, 4, nm, ns, 4, equal_var=False)     # only the summaries: Welch reads nothing else
    m = RPT_LIKE_SHARE * abs(nm - am)
    se = (rm - nm) / r.statistic
    dof = (rs ** 2 / 4 + ns ** 2 / 4) ** 2 / ((rs ** 2 / 4) ** 2 / 3 + (ns ** 2 / 4) ** 2 / 3)
    tost = max(stats.t.sf((rm - nm + m) / se, dof), stats.t.sf((m - (rm - nm)) / se, dof))
    assert v.loc['rpt-like-nope-blur', 'p'] == pytest.approx(tost) and tost > .05
    assert _paper_reading()['rpt-like-nope-blur'] == 'not decided' and _paper_reading()['nope-fragile-jpeg'] == 'for'


def test_training_drop_is_tested_against_the_same_runs_at_initialisation():
    rows = []
    for s, (t0, t1, u0) in enumerate([(.31, .49, .44), (.32, .47, .44), (.30, .50, .45)]):
        m = dict(condition='nope', seed=s, dataset='x', metric='ssdc', mode='normal')
        rows += [dict(stage='trained', layer=0, value=t0, **m), dict(stage='trained', layer=1, value=t1, **m),
                 dict(stage='untrained', layer=0, value=u0, **m), dict(stage='untrained', layer=1, value=u0, **m)]
    v = by_id(verdicts(result_frame(rows)))
    r = v.loc['nope-training-drop']
    assert (r['raw'], r['untrained'], r['kind']) == ('yes', 'not testable', 'test')
    drop = stats.ttest_rel([.31, .32, .30], [.44, .44, .45]).pvalue
    rise = stats.ttest_rel([.49, .47, .50], [.31, .32, .30]).pvalue
    assert r['p'] == pytest.approx(max(drop, rise))                          # both parts must hold: the weaker decides


def test_unpermuted_ssdc_above_zero_is_a_sanity_check(syn):
    v = by_id(verdicts(syn))
    assert v.loc['unpermuted-high', 'kind'] == 'sanity check' and 'holds by construction' in v.loc['unpermuted-high', 'reason']


def test_one_gate_for_every_alpha_claim(syn):
    "An APE anchored at α = 1 whose ΔSSDC there is ≈ 0: its ΔSSDC claim is tested, not refused by a second precondition."
    d = syn.copy()
    m = (d.condition == 'ape') & (d.metric == 'ssdc') & (d['mode'] == 'rpi') & (d.stage == 'trained')
    d.loc[m, 'value'] = .5                                                   # anchored at the input, at every α
    d.loc[(d.condition == 'ape') & (d.metric == 'delta_ssdc') & (d.stage == 'trained'), 'value'] = 0.
    d = d[d.metric != 'peak_ssdc']
    v = by_id(verdicts(d))
    assert v.loc['ape-alpha-delta', 'raw'] != 'not testable' and 'the gate' in v.loc['ape-alpha-delta', 'evidence']


def test_anchoring_places_on_written_out_curves():
    def curves(per_cond):
        rows = []
        for c, per_seed in per_cond.items():
            for s, curve in enumerate(per_seed):
                rows += [dict(condition=c, seed=s, metric='ssdc', mode='rpi', layer=l, value=v, dataset='x') for l, v in enumerate(curve)]
        return result_frame(rows)
    nope = [[.00, .00, .01, .00], [.01, .00, .00, .01], [-.01, .01, .00, .00]]
    t = curves({'nope': nope, 'ape': [[.3, .5, .5, .5], [.31, .52, .5, .49], [.29, .5, .51, .5]],
                'rope': [[n[0], n[1], n[2] + .05, n[3] + .20 + .01 * i] for i, n in enumerate(nope)],
                'rpt': [[x + .001 for x in n] for n in nope]})
    assert anchoring(t, 'ape')['where'] == 'at the input'
    assert anchoring(t, 'rope')['where'] == 'late, from layer 2' and anchoring(t, 'rope')['first'] == 2
    assert anchoring(t, 'rpt')['where'] == 'nowhere' and anchoring(t, 'nope')['where'] == 'nowhere'
    assert 'against 0' in anchoring(t[t.condition != 'nope'], 'ape')['where']
