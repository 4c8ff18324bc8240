"""pe_anchors.readings: sentences printed from the values, orderings that do not rank finer than the noise."""
import numpy as np
import pandas as pd

from pe_anchors.measures import acc, delta, fs, measure, per_seed, rpi, within
from pe_anchors.readings import _ordering, alpha_shape, padding_reading, readings
from pe_anchors.results import result_frame
from pe_anchors.testing import synthetic_results
from test_tables import three_seeds


def test_readings_print_the_values_and_the_tests():
    df = three_seeds()
    r = readings(df)
    assert f"{measure(df, 'ape', rpi(1))} after block 0" in r and 'index-anchored after block 0' in r
    d = (df.query("condition == 'ape' and metric == 'delta_ssdc' and sweep != sweep").sort_values('seed')['value'].to_numpy()
         - df.query("condition == 'nope' and metric == 'delta_ssdc'").sort_values('seed')['value'].to_numpy())
    assert f"minus NoPE's: {d.mean():+.3f}" in r
    assert 'SD over seeds (3 seeds)' in r


def test_a_one_seed_gap_is_not_ranked():
    rows = []
    for c, vals in dict(ape=[.72, .73, .71], nope=[.63, .64, .62], fam1=[.700], fam2=[.704]).items():
        rows += [dict(condition=c, seed=s, metric='acc', shift='clean', value=x, dataset='cifar10') for s, x in enumerate(vals)]
    o = _ordering(result_frame(rows), ['ape', 'nope', 'fam1', 'fam2'], acc(), .1)
    assert 'fam2 0.704 ≈ fam1 0.700' in o and o.endswith('> NoPE 0.630')
    alone = result_frame([r for r in rows if r['condition'] in ('fam1', 'fam2')])
    assert _ordering(alone, ['fam1', 'fam2'], acc(), .1) == 'fam2 0.704 ≈ fam1 0.700'    # no spread measured: no order


def test_readings_on_subsets_and_missing_conditions():
    df = synthetic_results(seeds=(0, 1))
    assert '**RoPE**' not in readings(df, conditions=['ape', 'nope'])
    import pytest
    with pytest.raises(ValueError, match=r"condition\(s\) \['peg'\] not in the table"): readings(df, conditions=['peg'])


def test_padding_reading_names_a_cause_only_from_the_values():
    def pad_rows(dz, dc):
        rows = []
        for p, d, a in (('zeros', dz, .7), ('circular', dc, .69)):
            m = dict(condition='peg', seed=0, dataset='cifar10', padding=p)
            rows += [dict(metric='ssdc', mode='rpi', layer=l, value=v, **m) for l, v in enumerate([0, d, d])]
            rows += [dict(metric='delta_ssdc', mode='rpi', value=d, **m), dict(metric='acc', shift='clean', value=a, **m),
                     dict(metric='acc', shift='jpeg', severity='paper', value=a / 2, **m),
                     dict(metric='fs', shift='jpeg', severity='paper', value=.5, **m)]
        return result_frame(rows)
    assert 'mixing grid neighbours' in padding_reading(pad_rows(.2, .18))
    assert 'zero padding' in padding_reading(pad_rows(.2, .0)) and 'one seed' in padding_reading(pad_rows(.2, .0))
    assert 'nothing to attribute' in padding_reading(pad_rows(.01, .0))


def test_alpha_shape_reads_monotone_or_where_it_turns():
    df = three_seeds()                                    # ΔSSDC at α = 1, .5, .1: means .44, .25, .01 (falling)
    assert alpha_shape(df, 'ape', delta()) == 'falls monotonically from 0.440 (α = 1) to 0.010 (α = 0.1)'
    bump = df.copy()
    m = (bump.condition == 'ape') & (bump.metric == 'delta_ssdc') & (bump.alpha == .5) & (bump.sweep == 'alpha')
    bump.loc[m, 'value'] += .4                            # α = .5 now the largest: it rises, then falls
    r = within(bump, 'ape', delta().at(.5), delta().at(1.))
    assert alpha_shape(bump, 'ape', delta()) == (f"is not monotone: 0.440 at α = 1, up to 0.650 at α = 0.5 ("
                                                 f"{r.effect:+.3f} [{r.low:+.3f}, {r.high:+.3f}] above α = 1, paired by seed), "
                                                 "then down to 0.010 at α = 0.1")


def test_orderings_take_the_quantitys_test():
    "Accuracy is ordered by Welch's test: a seed effect shared by two conditions does not make their gap decided."
    rows = []
    for c, vals in dict(a=[.70, .75, .65], b=[.69, .74, .64]).items():
        rows += [dict(condition=c, seed=s, metric='acc', shift='clean', value=x, dataset='cifar10') for s, x in enumerate(vals)]
    assert _ordering(result_frame(rows), ['a', 'b'], acc(), .1) == 'a 0.700 ≈ b 0.690'
