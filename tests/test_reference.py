"""pe_anchors.reference: the shipped digits reference is what the committed digits results give today, a run is placed
against a reference by the formulas written out, and the demo's preset is the reference's setting."""
import io, statistics

import pandas as pd
import pytest

from pe_anchors.reference import (HEADLINES, against_reference, demo_summary, headline_table, p_inside, read_reference,
                                  reference_of, reference_tables, references, setting_differences, write_reference)
from pe_anchors.results import load_results
from pe_anchors.testing import synthetic_results
from conftest import ROOT

DIGITS = ROOT / 'nbs' / 'results' / 'digits' / 'results.csv'
STALE = "the shipped reference differs from nbs/results/digits: run python tools/write_reference.py"


def _as_shipped(t: pd.DataFrame) -> pd.DataFrame:
    "A verdict table as it reads back from its CSV (every cell a string)."
    return pd.read_csv(io.StringIO(t.to_csv(index=False)), dtype=str, keep_default_na=False)


def test_the_shipped_reference_is_what_the_committed_digits_results_give():
    from pe_anchors.report import report_meta
    meta = report_meta(DIGITS)
    h, v = reference_tables(load_results(DIGITS), meta.get('num_classes'))
    ref, ref_v, rec = read_reference('digits')
    assert references() == ['digits']
    pd.testing.assert_frame_equal(ref[['condition', 'seed']], h[['condition', 'seed']], obj=STALE)
    pd.testing.assert_frame_equal(ref[list(HEADLINES)], h[list(HEADLINES)], rtol=0, atol=1e-12, obj=STALE)
    pd.testing.assert_frame_equal(ref_v, _as_shipped(v), obj=STALE)
    assert rec['experiment'] == meta['experiment'] and rec['hardware'] == sorted({r['hardware'] for r in meta['runs']}), STALE
    assert rec['seeds'] == sorted(h['seed'].unique().tolist()) == [0, 1, 2, 3, 4]


def test_the_demo_preset_is_the_reference_setting():
    from pe_anchors.config import preset
    exp = preset('digits').to_dict()
    assert setting_differences(exp, read_reference('digits')[2]) == []
    longer = preset('digits', train_kwargs=dict(epochs=2)).to_dict()
    assert [d.split(' ')[0] for d in setting_differences(longer, read_reference('digits')[2])] == ['train_kwargs']


@pytest.fixture(scope='module')
def toy_ref(tmp_path_factory):
    "A made-up five-seed experiment written as reference 'toy'."
    d = tmp_path_factory.mktemp('ref')
    df = synthetic_results(seeds=(0, 1, 2, 3, 4))
    write_reference(df, 'toy', dict(experiment=dict(name='toy')), dest=d)
    return df, d


@pytest.mark.parametrize('seeds', [(0,), (0, 1)])
def test_against_reference_by_hand(toy_ref, seeds):
    "Another made-up table (another noise seed): its mean over `seeds` against the reference, z and inside written out."
    ref_df, d = toy_ref
    mine = synthetic_results(seeds=seeds, seed=7)
    a = against_reference(mine, 'toy', d)
    ref_h, my_h = headline_table(ref_df), headline_table(mine)
    want = 0
    for c in my_h['condition'].unique():
        for k in HEADLINES:
            r = ref_h.loc[ref_h['condition'] == c, k].dropna().tolist()
            x = my_h.loc[my_h['condition'] == c, k].dropna().tolist()
            if not r or not x: continue
            want += 1
            row = a[(a['number'] == k) & (a['condition'].str.lower() == c)].iloc[0]
            v = sum(x) / len(x)
            assert row['yours'] == pytest.approx(v, abs=1e-12) and row['seeds'] == len(seeds)
            assert row['z'] == pytest.approx((v - statistics.mean(r)) / statistics.stdev(r), rel=1e-9)
            assert row['inside'] == (min(r) <= v <= max(r))
            assert (row['ref_min'], row['ref_max'], row['ref_seeds']) == (min(r), max(r), 5)
    assert len(a) == want > 0
    assert not a['inside'].all(), 'the test cannot fail on inside if every number lies inside'


def test_p_inside_by_counting():
    "Of n + 1 exchangeable draws, the last lies between the others' extremes unless it is the smallest or largest."
    import itertools
    for n in (2, 3, 5):
        perms = list(itertools.permutations(range(n + 1)))
        assert p_inside(n) == pytest.approx(sum(0 < p[-1] < n for p in perms) / len(perms))


def test_an_unknown_reference_is_one_clear_error(toy_ref):
    with pytest.raises(FileNotFoundError, match=r"no reference named 'cifar10' in .*; the references there: toy$"):
        read_reference('cifar10', toy_ref[1])
    with pytest.raises(FileNotFoundError, match=r"references there: digits"): against_reference(toy_ref[0], 'nothing')


def test_reference_of_and_the_demo_summary(toy_ref):
    ref_df, d = toy_ref
    one = synthetic_results(seeds=(0,), seed=7)
    assert reference_of(ref_df, dict(name='toy'), d) is None          # the reference's own runs
    assert reference_of(one, dict(name='other'), d) is None           # no reference of that name
    assert reference_of(one, dict(name='toy'), d) == 'toy'
    lines = demo_summary(one, dict(name='toy'), 'toy', d)
    a = against_reference(one, 'toy', d)
    assert len(lines) <= 25 and f"{int(a['inside'].sum())} of {len(a)} inside" in '\n'.join(lines)
    assert "The reference's verdicts" in '\n'.join(lines)             # one seed: the reference's, labelled
    three = demo_summary(synthetic_results(seeds=(0, 1, 2), seed=7), None, 'toy', d)
    assert any(l.startswith('Your verdicts (3 seeds') for l in three) and len(three) <= 25
