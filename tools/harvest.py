"""Bring a retrained run into the committed results (nbs/results/<experiment>/), keeping its model.

    python tools/harvest.py split EXPERIMENT                 # give every committed run its own runs/<run>/ table
    python tools/harvest.py run EXPERIMENT RUN               # RUN: the retrained run at any of its levels
        [--data-path cifar10-jpg.npz]

`run`: a finished retrained run (made by `pe_anchors sweep` with the committed experiment file), given as the run, its
train/, its model/ or its model file; its final model is kept (`kept.export_run` into its model/ when the sweep did
not keep one), its table is compared row by row with the committed one of the same run (`kept.compare_results`,
appended to `retrained.csv`: the determinism check), and the kept model is measured again with the current library
(`kept.reevaluate`) into the committed folder, replacing the run there. The paths are `pe_anchors.rundir`'s.
"""
import argparse, json, sys
from pathlib import Path
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / 'nbs' / 'results'

def split(name: str):
    from pe_anchors.results import read_results, write_results
    from pe_anchors.rundir import ExperimentDir
    d = ExperimentDir(RESULTS / name)
    df = read_results(d.results)
    df = df[df['metric'] != 'peak_ssdc']                                   # derived rows, added again when gathered
    for r in d.read_meta()['runs']:
        run = d.run(r['condition'], r['seed'])
        if run.is_finished(): continue
        rows = df[(df['condition'] == r['condition']) & (df['seed'] == r['seed'])]
        if rows.empty: sys.exit(f"{name}: no rows of {run.path.name} in {d.results.name}")
        run.path.mkdir(parents=True, exist_ok=True)
        write_results(rows.reset_index(drop=True), run.results)
        run.record.write_text(json.dumps(r, indent=2))
        print(f"{run.path.relative_to(ROOT)}: {len(rows)} rows")

def harvest(name: str, run_dir: Path, data_path: str | None):
    from pe_anchors.kept import compare_results, export_run, keep_runs, reevaluate
    from pe_anchors.results import read_results, write_results
    from pe_anchors.rundir import RUNS, ExperimentDir, RunDir, find_run
    run = find_run(run_dir.resolve())                                      # the run at any of its levels
    if run.path.parent.name != RUNS: sys.exit(f"{run.path} is not a run of an experiment (runs/<condition>-s<seed>/)")
    rec = run.read_record()
    c, s = rec['condition'], rec['seed']
    if not run.has_kept_model(): export_run(run.path, run.kept)
    src, dest = ExperimentDir(run.path.parent.parent), ExperimentDir(RESULTS / name)
    old = dest.run(c, s)
    new = read_results(run.results)
    if old.is_finished() and not old.has_kept_model():                     # a committed row from a lost model
        cmp = compare_results(read_results(old.results), new).assign(run=RunDir.name(c, s), trained_on=rec.get('hardware', ''),
                                                                     committed_on=old.read_record().get('hardware', ''))
        log = dest.table('retrained')
        prev = pd.read_csv(log) if log.exists() else None
        if prev is not None: prev = prev[prev['run'] != RunDir.name(c, s)]
        out = pd.concat([prev, cmp], ignore_index=True) if prev is not None else cmp
        write_results(out, log)
        print(cmp.to_string())
    if 'tap' in new:                                   # measured by the current evaluation already (output tap, per-α curves)
        keep_runs(src.path, dest.path, conditions=[c], seeds=[s])
        print(f"{old.path.relative_to(ROOT)}: kept as measured")
    else:
        reevaluate(src.path, dest.path, data_path=data_path, conditions=[c], seeds=[s])
        print(f"{old.path.relative_to(ROOT)}: re-evaluated with its kept model")

if __name__ == '__main__':
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest='cmd', required=True)
    a = sub.add_parser('split'); a.add_argument('experiment')
    b = sub.add_parser('run'); b.add_argument('experiment'); b.add_argument('run_dir', type=Path); b.add_argument('--data-path')
    args = p.parse_args()
    if args.cmd == 'split': split(args.experiment)
    else: harvest(args.experiment, args.run_dir, args.data_path)
