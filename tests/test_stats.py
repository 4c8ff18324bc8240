"""pe_anchors.stats: every test against scipy or the formula written out."""
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from pe_anchors.stats import (Comparison, Equivalence, TooFewSeeds, compare, detectable, detectable_effect, equivalence, fmt_p,
                              fmt_tiers, holm, p_is, pairing_ratio, pooled_sd, smallest_exact_p, tiers)

A = pd.Series([.5755, .5594, .5619], index=[0, 1, 2])
B = pd.Series([.5227, .5222, .5274], index=[0, 1, 2])


def test_paired_comparison_is_scipys_paired_t_with_its_interval():
    c = compare(A, B)
    d = (A - B).to_numpy()
    half = stats.t.ppf(.975, 2) * d.std(ddof=1) / math.sqrt(3)
    assert c.test == 'paired t' and c.n == '3 pairs' and c.df == 2
    assert c.effect == pytest.approx(d.mean()) and (c.low, c.high) == (pytest.approx(d.mean() - half), pytest.approx(d.mean() + half))
    assert c.p == pytest.approx(stats.ttest_rel(A, B).pvalue) and c.sign == 1


def test_welch_when_the_seeds_differ():
    b = B.iloc[:2]
    c = compare(A, b)
    va, vb = A.var(ddof=1) / 3, b.var(ddof=1) / 2
    df = (va + vb) ** 2 / (va ** 2 / 2 + vb ** 2 / 1)                     # Welch–Satterthwaite
    assert c.test == 'Welch t' and c.df == pytest.approx(df)
    assert c.high - c.effect == pytest.approx(stats.t.ppf(.975, df) * math.sqrt(va + vb))
    assert c.p == pytest.approx(stats.ttest_ind(A, b, equal_var=False).pvalue)
    assert compare(A, B, paired=False).test == 'Welch t'
    with pytest.raises(ValueError, match='same seeds'): compare(A, b, paired=True)


def test_one_sample_and_the_constant_difference():
    c = compare(A, mu=.5)
    assert c.test == 'one-sample t' and c.p == pytest.approx(stats.ttest_1samp(A, .5).pvalue)
    assert c.effect == pytest.approx(A.mean() - .5)
    same = compare(A, A - .01)                                              # identical differences: no spread
    assert (same.effect, same.low, same.high, same.sign) == (pytest.approx(.01), pytest.approx(.01), pytest.approx(.01), 1)


def test_one_seed_needs_a_reference_spread():
    a, b = pd.Series([.577]), pd.Series([.571])
    with pytest.raises(TooFewSeeds, match='no seed spread'): compare(a, b)
    c = compare(a, b, ref_sd=(.012, 10))
    se = .012 * math.sqrt(2)
    assert c.high - c.effect == pytest.approx(stats.t.ppf(.975, 10) * se) and c.sign == 0
    assert c.p == pytest.approx(2 * stats.t.sf(.006 / se, 10))
    big = compare(pd.Series([.70]), pd.Series([.48]), ref_sd=(.012, 10))
    assert big.sign == 1


def test_tost_is_the_larger_of_two_one_sided_tests():
    rpt, nope = A, pd.Series([.558, .5989, .5555], index=[0, 1, 2])
    for m in (.01, .024, .05):
        e = equivalence(rpt, nope, margin=m)
        lo = stats.ttest_rel(rpt + m, nope, alternative='greater').pvalue
        hi = stats.ttest_rel(rpt - m, nope, alternative='less').pvalue
        assert e.p == pytest.approx(max(lo, hi)) and e.equivalent == (max(lo, hi) < .05)
        d = (rpt - nope).to_numpy(); half = stats.t.ppf(.95, 2) * d.std(ddof=1) / math.sqrt(3)
        assert (e.low, e.high) == (pytest.approx(d.mean() - half), pytest.approx(d.mean() + half))   # the 90% interval
    x = pd.Series([.001, -.002, .0015])
    e = equivalence(x, margin=.03)
    assert e.equivalent and e.p == pytest.approx(max(stats.ttest_1samp(x, -.03, alternative='greater').pvalue,
                                                     stats.ttest_1samp(x, .03, alternative='less').pvalue))
    with pytest.raises(ValueError, match='margin must be > 0'): equivalence(x, margin=0)


def test_pooled_sd_by_hand():
    sd, dof = pooled_sd({'x': pd.Series([1., 2, 4]), 'y': pd.Series([3., 5]), 'z': pd.Series([7.])})
    assert dof == 3 and sd == pytest.approx(math.sqrt((2 * np.var([1, 2, 4], ddof=1) + np.var([3, 5], ddof=1)) / 3))
    assert pooled_sd({'z': pd.Series([7.])}) == (pytest.approx(math.nan, nan_ok=True), 0.)


def test_tiers_rank_only_what_the_noise_allows():
    one = {k: pd.Series([x]) for k, x in dict(a=.70, b=.698, c=.68, d=.48).items()}
    assert tiers(one, ref_sd=(.01, 12)) == [['a', 'b', 'c'], ['d']]          # a one-seed gap of .002 is not ranked
    assert tiers(one) == [['a', 'b', 'c', 'd']]                             # no seed spread at all: no order
    three = {'p': pd.Series([.73, .724, .735]), 'q': pd.Series([.719, .718, .723]), 'r': pd.Series([.63, .64, .636])}
    assert tiers(three) == [['p'], ['q'], ['r']]
    assert fmt_tiers(one, ref_sd=(.01, 12)) == 'a 0.700 ≈ b 0.698 ≈ c 0.680 > d 0.480'


def test_detectable_difference():
    assert detectable(3) == pytest.approx(stats.t.ppf(.975, 2) / math.sqrt(3))
    with pytest.raises(TooFewSeeds): detectable(1)


def test_standard_errors_are_the_tests_own():
    assert compare(A, B).se == pytest.approx((A - B).std() / math.sqrt(3))
    assert compare(A, B, paired=False).se == pytest.approx(math.sqrt(A.var() / 3 + B.var() / 3))
    assert compare(A, mu=.5).se == pytest.approx(A.std() / math.sqrt(3))


def test_beyond_the_margin_is_the_one_sided_test_the_other_way():
    far = pd.Series([.30, .31, .29])
    e = equivalence(far, margin=.03)
    assert e.p_beyond == pytest.approx(stats.ttest_1samp(far, .03, alternative='greater').pvalue) and e.beyond
    near = equivalence(pd.Series([.001, -.002, .0015]), margin=.03)
    assert not near.beyond and near.equivalent
    neg = equivalence(-far, margin=.03)                                      # the other side: the same test mirrored
    assert neg.p_beyond == pytest.approx(e.p_beyond)


def test_holm_by_hand():
    p = [.01, .04, .03, math.nan, .005, .5]
    # sorted: .005, .01, .03, .04, .5 with m = 5: × 5, 4, 3, 2, 1, then the running maximum
    expect = {4: .025, 0: .04, 2: .09, 1: .09, 5: .5}
    adj = holm(p)
    for i, v in expect.items(): assert adj[i] == pytest.approx(v), i
    assert math.isnan(adj[3])
    assert list(holm([.9, .8])) == [1., 1.]                                   # capped at 1


def test_detectable_effect_has_the_stated_power():
    "80% power, checked against the noncentral t directly and, for TOST, against a simulation of the decision."
    c = compare(A, B)
    d = detectable_effect(c)
    tc = stats.t.ppf(.975, c.df)
    power = stats.nct.sf(tc, c.df, d / c.se) + stats.nct.cdf(-tc, c.df, d / c.se)
    assert power == pytest.approx(.8, abs=1e-6)
    w = compare(A, B, paired=False)
    dw = detectable_effect(w)
    assert stats.nct.sf(stats.t.ppf(.975, w.df), w.df, dw / w.se) == pytest.approx(.8, abs=1e-3)
    e = equivalence(A, B, margin=.05)
    m = detectable_effect(e)
    assert m == pytest.approx(e.se * (stats.t.ppf(.95, e.df) + stats.t.ppf(.9, e.df)))
    rng = np.random.default_rng(0)                        # true difference 0, the SD as observed, se taken as known
    x = e.se * rng.standard_t(e.df, 200_000)
    shown = np.abs(x) < m - stats.t.ppf(.95, e.df) * e.se
    assert shown.mean() == pytest.approx(.8, abs=.01)


def test_smallest_exact_p_by_enumeration():
    import itertools
    d = np.array([1., 2., 3.])                                              # every sign pattern of 3 pairs
    stats_ = [abs(sum(s * d)) for s in itertools.product((-1, 1), repeat=3)]
    assert smallest_exact_p(3) == pytest.approx(sum(t >= max(stats_) for t in stats_) / 8)
    x = [1., 2., 3., 4., 5., 6.]                                            # every split of 3 vs 3
    diffs = [abs(np.mean([x[i] for i in g]) - np.mean([x[i] for i in range(6) if i not in g]))
             for g in itertools.combinations(range(6), 3)]
    assert smallest_exact_p(3, 3) == pytest.approx(sum(t >= max(diffs) for t in diffs) / len(diffs))


def test_pairing_ratio_by_hand():
    a, b = pd.Series([1., 2., 4.]), pd.Series([1.5, 2.2, 4.1])
    assert pairing_ratio(a, b) == pytest.approx((a - b).std() / math.sqrt(a.var() + b.var()))
    with pytest.raises(TooFewSeeds): pairing_ratio(a.iloc[:1], b.iloc[:1])


def test_p_values_as_printed():
    assert (fmt_p(.0004), fmt_p(.0123), fmt_p(1.), fmt_p(math.nan)) == ('< .001', '.012', '1', '–')
    assert (p_is(.0004), p_is(.02), p_is(math.nan)) == ('p < .001', 'p = .02', 'no p')


def test_tiers_follow_the_design():
    "Paired and Welch tiers differ where a shared seed effect is large: the design, not the data, picks."
    shared = np.array([0., .05, -.05])
    v = {'a': pd.Series(.70 + shared + [.001, .002, .0]), 'b': pd.Series(.69 + shared)}
    assert tiers(v, paired='auto') == [['a'], ['b']]              # paired: the shared part removed
    assert tiers(v, paired=False) == [['a', 'b']]                 # Welch: within the seed spread
