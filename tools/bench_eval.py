"""Evaluation time per condition, before and after a change, on the same machine: `evaluate_model` (every measurement
of an experiment on one trained model: SSDC normal and under RPI, the position table's SSDC, accuracy and fragility under
the paper's shifts, the α sweep) for each condition of a preset, on one `EvalData` with a disk cache, as `run_experiment`
runs it. The models are the conditions' initialisations (seed 0): evaluation does the same work on any weights.

    python bench_eval.py BASELINE_CHECKOUT [--out DIR] [--threads 2] [--cifar-conditions ape rope nope]

runs the measurement in fresh processes, once with the code of BASELINE_CHECKOUT on the path ("before") and once with
the installed package ("after"), on the digits preset and, when PE_ANCHORS_CIFAR_NPZ names a CIFAR-10 npz, on the
cifar10-cpu preset; it writes eval_time.csv (seconds per condition and the EvalData construction) and meta.json to
--out (default: nbs/results/eval_time) and prints them."""
import argparse, json, os, platform, subprocess, sys, time
from pathlib import Path

WORKER = r"""
import json, os, sys, tempfile, time, warnings
warnings.filterwarnings('ignore')
import torch
torch.set_num_threads(int(sys.argv[3]))
from pe_anchors.data import get_data
from pe_anchors.experiment import EvalData, evaluate_model, preset
from pe_anchors.learner import pe_learner
setting, conditions = sys.argv[1], sys.argv[2].split(',')
exp = preset(setting)
data = get_data('digits', **exp.data_kwargs) if setting == 'digits' else get_data('cifar10', path=os.environ['PE_ANCHORS_CIFAR_NPZ'])
models = {c: pe_learner(data, c, model=exp.model, seed=0, show_progress=False, device='cpu', model_kwargs=exp.model_kwargs,
                        **exp.train_kwargs).model for c in conditions}
out = {}
with tempfile.TemporaryDirectory() as cache:                     # as run_experiment: shifted sets cached on disk
    t = time.perf_counter()
    ev = EvalData(data, exp.ssdc_images, exp.eval_bs, 'cpu', cache_dir=cache, sample_seed=exp.sample_seed)
    out['EvalData'] = time.perf_counter() - t
    for c, m in models.items():
        t = time.perf_counter()
        evaluate_model(m, ev, exp, c, seed=0, show=False)
        out[c] = time.perf_counter() - t
print(json.dumps(out))
"""

def measure(code: str, setting: str, conditions: list[str], threads: int, pythonpath: str | None) -> dict:
    "Seconds of one setting in a fresh process, with `pythonpath` (the baseline checkout) first on the path if given."
    env = {**os.environ, 'PE_ANCHORS_QUIET': '1', 'PYTHONWARNINGS': 'ignore'}
    if pythonpath: env['PYTHONPATH'] = pythonpath + (os.pathsep + env['PYTHONPATH'] if env.get('PYTHONPATH') else '')
    else: env.pop('PYTHONPATH', None)
    r = subprocess.run([sys.executable, '-c', code, setting, ','.join(conditions), str(threads)], env=env,
                       capture_output=True, text=True)
    if r.returncode: raise RuntimeError(f"{code_label(pythonpath)} {setting} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])

def code_label(pythonpath): return 'before' if pythonpath else 'after'

def main():
    a = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    a.add_argument('baseline', help='a checkout of the code before the change (its pe_anchors package is used for "before")')
    a.add_argument('--out', default=str(Path(__file__).resolve().parents[1] / 'nbs' / 'results' / 'eval_time'))
    a.add_argument('--threads', type=int, default=2)
    a.add_argument('--digits-conditions', nargs='+', default=['ape', 'spe', 'rope', 'nope', 'rpt'])
    a.add_argument('--cifar-conditions', nargs='+', default=['ape', 'rope', 'nope'])
    args = a.parse_args()
    import pandas as pd, torch
    settings = [('digits', args.digits_conditions)]
    if os.environ.get('PE_ANCHORS_CIFAR_NPZ'): settings.append(('cifar10-cpu', args.cifar_conditions))
    rows = []
    for setting, conditions in settings:
        for pythonpath in (args.baseline, None):
            t = time.perf_counter()
            for step, s in measure(WORKER, setting, conditions, args.threads, pythonpath).items():
                rows.append(dict(setting=setting, code=code_label(pythonpath), step=step, seconds=round(s, 2)))
            print(f"{setting} {code_label(pythonpath)}: {time.perf_counter() - t:.0f} s", flush=True)
    df = pd.DataFrame(rows)
    out = Path(args.out); out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / 'eval_time.csv', index=False)
    (out / 'meta.json').write_text(json.dumps(dict(
        hardware=f"CPU {platform.machine()} ({os.cpu_count()} cores), {args.threads} torch threads; torch {torch.__version__}",
        models="each condition's initialisation (seed 0): pe_learner(...).model", cache='EvalData with a disk cache, as run_experiment',
        data="digits preset; cifar10-cpu preset on a CIFAR-10 npz of 20k training / 10k validation images",
        date=time.strftime('%Y-%m-%d')), indent=2))
    wide = df.pivot_table(index=['setting', 'step'], columns='code', values='seconds', sort=False)
    wide['ratio'] = (wide['before'] / wide['after']).round(2)
    print(wide.to_string())

if __name__ == '__main__': main()
