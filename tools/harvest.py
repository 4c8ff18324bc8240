"""Bring a retrained run into the committed results (nbs/results/<experiment>/), keeping its model.

    python tools/harvest.py split EXPERIMENT                 # give every committed run its own runs/<run>/ table
    python tools/harvest.py run EXPERIMENT RUN_DIR --data-path cifar10-jpg.npz

`run`: the run directory of a finished retrained run (made by `pe_anchors sweep` with the committed experiment file);
its final model is kept (`experiment.export_run` into RUN_DIR/model when the sweep predates kept models), its table is
compared row by row with the committed one of the same run (`experiment.compare_results`, appended to
`retrained.csv`: the determinism check), and the kept model is measured again with this version
(`experiment.reevaluate`) into the committed folder, replacing the run there.
"""
import argparse, json, shutil, sys
from pathlib import Path
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / 'nbs' / 'results'

def split(name: str):
    from pe_anchors.results import read_results, write_results
    d = RESULTS / name
    meta = json.loads((d / 'meta.json').read_text())
    df = read_results(d / 'results.csv')
    df = df[df['metric'] != 'peak_ssdc']                                   # derived rows, added again when gathered
    for r in meta['runs']:
        run = d / 'runs' / f"{r['condition']}-s{r['seed']}"
        if (run / 'results.csv').exists(): continue
        rows = df[(df['condition'] == r['condition']) & (df['seed'] == r['seed'])]
        if rows.empty: sys.exit(f"{name}: no rows of {run.name} in results.csv")
        run.mkdir(parents=True, exist_ok=True)
        write_results(rows.reset_index(drop=True), run / 'results.csv')
        (run / 'run.json').write_text(json.dumps(r, indent=2))
        print(f"{run.relative_to(ROOT)}: {len(rows)} rows")

def harvest(name: str, run_dir: Path, data_path: str | None):
    from pe_anchors.experiment import KEPT_MODEL, compare_results, export_run, keep_runs, reevaluate
    from pe_anchors.results import main_rows, read_results, write_results
    run_dir = run_dir.resolve()
    rec = json.loads((run_dir / 'run.json').read_text())
    c, s = rec['condition'], rec['seed']
    if not (run_dir / KEPT_MODEL).exists(): export_run(run_dir, run_dir / KEPT_MODEL)
    dest = RESULTS / name
    old_f = dest / 'runs' / f'{c}-s{s}' / 'results.csv'
    new = read_results(run_dir / 'results.csv')
    if old_f.exists() and not (dest / 'runs' / f'{c}-s{s}' / KEPT_MODEL).exists():   # a committed row from a lost model
        cmp = compare_results(read_results(old_f), new).assign(run=f'{c}-s{s}', trained_on=rec.get('hardware', ''),
                                                               committed_on=json.loads(old_f.with_name('run.json').read_text()).get('hardware', ''))
        log = dest / 'retrained.csv'
        prev = pd.read_csv(log) if log.exists() else None
        if prev is not None: prev = prev[prev['run'] != f'{c}-s{s}']
        out = pd.concat([prev, cmp], ignore_index=True) if prev is not None else cmp
        write_results(out, log)
        print(cmp.to_string())
    if 'tap' in new:                                   # measured by this version already (output tap, per-α curves)
        keep_runs(run_dir.parent.parent, dest, conditions=[c], seeds=[s])
        print(f"{dest.relative_to(ROOT)}/runs/{c}-s{s}: kept as measured")
    else:
        reevaluate(run_dir.parent.parent, dest, data_path=data_path, conditions=[c], seeds=[s])
        print(f"{dest.relative_to(ROOT)}/runs/{c}-s{s}: re-evaluated with its kept model")

if __name__ == '__main__':
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest='cmd', required=True)
    a = sub.add_parser('split'); a.add_argument('experiment')
    b = sub.add_parser('run'); b.add_argument('experiment'); b.add_argument('run_dir', type=Path); b.add_argument('--data-path')
    args = p.parse_args()
    if args.cmd == 'split': split(args.experiment)
    else: harvest(args.experiment, args.run_dir, args.data_path)
