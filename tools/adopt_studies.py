"""Bring the committed study tables written before the study layer into it (run once, 2026-12): every CIFAR-10 results
folder's `cifar10c.csv` and `resolution.csv`, and the mechanistic tables of `cifar10-cpu/mech`, split into per-run
folders with records (`study.adopt_tables`). The mechanistic RoPE and SAE rows of seeds other than 0 were measured with
permutation seed 0 rather than the experiment's rule (1000 × seed): they are not adopted, and are measured again.

    python tools/adopt_studies.py
"""
from pathlib import Path
from pe_anchors.study import adopt_tables
from pe_anchors.shift_study import corruption_declaration, resolution_declaration
from pe_anchors.mech.study import probes_declaration, rope_declaration, sae_declaration

R = Path(__file__).resolve().parents[1] / 'nbs' / 'results'
for e in sorted(p.parent for p in R.glob('*/cifar10c.csv')):
    for st in (corruption_declaration(), resolution_declaration()):
        t = adopt_tables(st, e)[st.name]
        print(f"{e.name}/{st.name}: {t[['condition', 'seed']].drop_duplicates().shape[0]} runs, {len(t)} rows")
mech = R / 'cifar10-cpu' / 'mech'
for st, keep in ((probes_declaration(), None), (rope_declaration(), lambda c, s: s == 0), (sae_declaration(), lambda c, s: s == 0)):
    t = adopt_tables(st, R / 'cifar10-cpu', mech, keep=keep)
    print(f"cifar10-cpu/mech/{st.name}: " + ', '.join(f"{k} {len(v)} rows" for k, v in t.items()))

# frost was measured on its own after the other 14 corruptions and its rows appended; a fresh measurement writes every
# corruption in `available_corruptions()` order, severities ascending: the per-run tables are put in that order
from pe_anchors.corruptions import available_corruptions
from pe_anchors.results import read_table, write_results
from pe_anchors.rundir import StudyDir
from pe_anchors.study import gather_study
names = available_corruptions()
for e in sorted(p.parent for p in R.glob('*/cifar10c.csv')):
    sd = StudyDir(e, 'cifar10c')
    for c, s in sd.runs():
        f = sd.run(c, s) / 'cifar10c.csv'
        t = read_table(f)
        order = sorted(range(len(t)), key=lambda i: (names.index(t['corruption'].iloc[i]), t['severity'].iloc[i]))
        if order != list(range(len(t))): write_results(t.iloc[order].reset_index(drop=True), f)
    gather_study(corruption_declaration(), e)
    print(f"{e.name}/cifar10c: rows in the order a fresh measurement writes")

# a per-run probe table holds the floor its own rows give (a NoPE is its own floor, another PE none): the floor across
# runs is the gathered table's (`finish`), as a fresh measurement writes them
from pe_anchors.mech.position import content_floor
sd = StudyDir(mech, 'probes')
for c, s in sd.runs():
    f = sd.run(c, s) / 'probes.csv'
    write_results(content_floor(read_table(f)), f)
gather_study(probes_declaration(), mech)
print("cifar10-cpu/mech/probes: per-run floors as a fresh measurement writes them")
