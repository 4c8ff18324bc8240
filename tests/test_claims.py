"""pe_anchors.claims: verdicts that can fail, sanity checks apart, preconditions, missing measurements named."""
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from pe_anchors.claims import ANCHOR_MARGIN, CLAIMS, CLAIM_IDS, anchoring, evaluate, split_verdicts, verdicts
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
              'pe-helps', 'ape-alpha-delta', 'ape-alpha-fs'):
        assert v.loc[i, 'verdict'] == 'yes', (i, v.loc[i, 'evidence'])


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
        assert by_id(verdicts(d)).loc[cid, 'verdict'] == 'no', cid


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
    assert (fixed.loc['spe-at-input', 'verdict'], fixed.loc['spe-at-input', 'untrained'], fixed.loc['spe-at-input', 'kind']) \
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
    assert v.loc['rope-robust-jpeg', 'verdict'] == 'yes'                      # NoPE is not in it


def test_rpt_like_nope_is_an_equivalence_test_against_half_the_gap():
    rows = []
    fs = dict(ape=[.40, .42, .44], nope=[.60, .62, .61], rpt=[.61, .60, .62])
    for c, vals in fs.items():
        for s, f in enumerate(vals):
            m = dict(condition=c, seed=s, dataset='cifar10')
            rows += [dict(metric='acc', shift='clean', value=.7, **m), dict(metric='fs', shift='jpeg', severity='paper', value=f, **m)]
    r = evaluate(next(c for c in CLAIMS if c.id == 'rpt-like-nope-jpeg'), result_frame(rows))
    margin = .5 * abs(np.mean(fs['nope']) - np.mean(fs['ape']))
    d = np.array(fs['rpt']) - np.array(fs['nope'])
    p = max(stats.ttest_1samp(d, -margin, alternative='greater').pvalue, stats.ttest_1samp(d, margin, alternative='less').pvalue)
    assert r['verdict'] == ('yes' if p < .05 else 'inconclusive') and f"±{margin:.3f}" in r['evidence']
    assert r['p'] == pytest.approx(p)


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
