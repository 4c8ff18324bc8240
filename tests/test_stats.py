"""pe_anchors.stats: every test against scipy or the formula written out."""
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from pe_anchors.stats import (Comparison, TooFewSeeds, compare, detectable, equivalence, fmt_tiers, pooled_sd, tiers)

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
