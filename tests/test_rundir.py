"""pe_anchors.rundir: a run found from any of its levels, an experiment's runs and records, the one rule for whether a
run matches a setting, folders replaced whole; and no other module of the package joining run-directory paths."""
import ast, json, re
from pathlib import Path

import pytest

import pe_anchors.rundir as rd
from pe_anchors.rundir import (ExperimentDir, RunDir, TrainDir, config_diff, find_experiment, find_run, recover, run_setting,
                               staging, swap_in, train_dir_of)

ROOT = Path(__file__).resolve().parents[1]


def _run(root: Path, name: str = 'ape-s0') -> Path:
    "A run of an experiment with a training run, final weights, a kept Hub folder, a table and a record (contents faked)."
    run = root / 'runs' / name
    (run / 'train').mkdir(parents=True)
    (run / 'train' / 'config.json').write_text(json.dumps(dict(condition=name.split('-')[0], seed=0)))
    (run / 'train' / 'model.safetensors').write_bytes(b'w')
    (run / 'model').mkdir()
    (run / 'model' / 'config.json').write_text('{"architecture": "pe_vit_nano_patch2_16"}')
    (run / 'model' / 'model.safetensors').write_bytes(b'w')
    (run / 'results.csv').write_text('x')
    (run / 'run.json').write_text(json.dumps(dict(condition=name.split('-')[0], seed=0)))
    return run


def test_a_run_is_found_from_any_of_its_levels(tmp_path):
    run = _run(tmp_path)
    levels = [run, run / 'train', run / 'model', run / 'train' / 'model.safetensors', run / 'model' / 'model.safetensors']
    assert all(find_run(p) == RunDir(run) for p in levels)
    r = find_run(run / 'train')
    assert (r.train.config, r.results, r.kept) == (run / 'train' / 'config.json', run / 'results.csv', run / 'model')
    assert r.has_kept_model() and r.has_model() and r.is_finished() and not r.alone
    alone = tmp_path / 'alone'; alone.mkdir(); (alone / 'config.json').write_text('{}'); (alone / 'model.safetensors').write_bytes(b'w')
    assert find_run(alone).alone and find_run(alone / 'model.safetensors') == RunDir(alone, train=alone)
    assert train_dir_of(run) == train_dir_of(run / 'train' / 'model.safetensors') == TrainDir(run / 'train')
    assert train_dir_of(tmp_path / 'new') == TrainDir(tmp_path / 'new')
    with pytest.raises(FileNotFoundError, match='no run at .* expected a run directory'): find_run(tmp_path / 'nowhere')
    with pytest.raises(ValueError, match='is a file, not a run'): find_run(run / 'train' / 'config.json')
    with pytest.raises(ValueError, match='is not a run'): find_run(tmp_path / 'runs')


def test_an_experiment_holds_its_runs_records_and_tables(tmp_path):
    e = ExperimentDir(tmp_path)
    _run(tmp_path, 'ape-s0'); _run(tmp_path, 'nope-s0')
    (e.runs_dir / '.ape-s0.tmp-1234abcd').mkdir()                                # a writer's copy is not a run
    assert [r.path.name for r in e.runs()] == ['ape-s0', 'nope-s0'] == [r.path.name for r in e.finished()]
    assert list(e.run_tables()) == ['runs/ape-s0/results.csv', 'runs/nope-s0/results.csv']
    assert e.kept_runs() == [('ape', 0), ('nope', 0)] and e.run(*e.kept_runs()[0]) == RunDir(e.runs_dir / 'ape-s0')
    assert e.record() is None and e.sample_record() is None
    e.meta.write_text(json.dumps(dict(experiment=dict(name='m'), ssdc_sample=dict(sha1='s'))))
    assert e.record() == dict(name='m') and e.sample_record() == dict(sha1='s')
    e.experiment.write_text(json.dumps(dict(name='e'))); e.sample.write_text(json.dumps(dict(sha1='t')))
    assert e.record() == dict(name='e') and e.sample_record() == dict(sha1='t')   # the directory's own files first
    e.results.write_text('x')
    assert find_experiment(tmp_path).path == find_experiment(e.results).path == tmp_path
    with pytest.raises(ValueError, match=r'is a run of the experiment .*: give the experiment directory'):
        find_experiment(e.run('ape', 0).path)


def test_one_rule_says_whether_a_run_matches(tmp_path):
    cfg = dict(condition='ape', seed=0, model='m', recipe=dict(epochs=3, lr=1e-3), hardware='a CPU', created='today')
    assert config_diff(cfg, {**cfg, 'hardware': 'a GPU', 'created': 'later'}) == []
    assert config_diff(cfg, {**cfg, 'seed': 1, 'recipe': dict(epochs=3, lr=2e-3)}) == ['seed', 'recipe.lr']
    assert config_diff(cfg, {**cfg, 'recipe': dict(epochs=3, lr=1e-3, bs=64)}) == []               # one record's field only
    assert config_diff(cfg, {**cfg, 'recipe': dict(epochs=3, lr=1e-3, bs=64)}, defaults=dict(bs=128)) == ['recipe.bs']
    assert config_diff(cfg, dict(model='m', recipe=dict(lr=1e-3)), keys=('model', 'recipe')) == []
    assert run_setting(dict(data=dict(builder='cifar10', path='/a/b'), model='m'))['data'] == dict(builder='cifar10')


def test_a_folder_is_replaced_whole(tmp_path):
    dest = tmp_path / 'runs' / 'ape-s0'; dest.mkdir(parents=True); (dest / 'results.csv').write_text('old')
    tmp = staging(dest); tmp.mkdir(); (tmp / 'results.csv').write_text('new')
    assert tmp.name.startswith('.ape-s0.tmp-') and tmp.parent == dest.parent
    swap_in(tmp, dest)
    assert (dest / 'results.csv').read_text() == 'new' and [p.name for p in dest.parent.iterdir()] == ['ape-s0']
    old = staging(dest, 'old'); dest.rename(old); staging(dest).mkdir()                # killed between the renames
    recover(dest)
    assert (dest / 'results.csv').read_text() == 'new' and [p.name for p in dest.parent.iterdir()] == ['ape-s0']


# ---------------------------------------------------------------- no other module joins run-directory paths
LAYOUT = {getattr(rd, n) for n in ('CONFIG', 'METRICS', 'FINAL', 'MODEL_FILE', 'CHECKPOINTS', 'STATE', 'TRAIN', 'RESULTS',
                                   'RUN_RECORD', 'KEPT_MODEL', 'RUNS', 'EXPERIMENT', 'META', 'SAMPLE', 'SHIFTS', 'CACHE',
                                   'REPORT', 'MECH', 'LOCK')} | {'report.md', 'report.html', 'figures'}
# modules whose paths are of other kinds: an image folder's train/ and val/ (datasets.py) is a dataset, not a run
OTHER_KINDS = {'datasets.py'}
# the mechanistic study's own summary, meta.json in its output folder (`rundir.ExperimentDir(out).meta` says the same)
ALLOWED = {('mech/study.py', "out / 'meta.json'"): 1}


def _layout(s: str) -> bool:
    "Whether a literal names a piece of the run layout (or a run's folder name, `<condition>-s<seed>`)."
    return any(p in LAYOUT or p.startswith(rd.RESULTS + rd.CHECKSUM) for p in re.split(r'[/*]', s))

def _literal(node) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str): return node.value
    if isinstance(node, ast.JoinedStr):
        parts = [v.value if isinstance(v, ast.Constant) else '\0' for v in node.values]
        text = ''.join(parts)
        return 'runs' if re.search(r'\0-s\0', text) else text                    # f'{condition}-s{seed}': a run's name
    return None

def run_path_joins(tree: ast.AST, source: str) -> list[str]:
    "The expressions of `tree` that join a run-layout name onto a path: `/`, `joinpath`, `Path(a, b)`, `os.path.join`, `with_name`, `glob`."
    hits = []
    for n in ast.walk(tree):
        args = []
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div): args = [n.right]
        elif isinstance(n, ast.Call):
            f = n.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ''
            if name in ('joinpath', 'with_name', 'glob', 'rglob', 'join') or (name == 'Path' and len(n.args) > 1):
                args = n.args
        if any(_literal(a) is not None and _layout(_literal(a)) for a in args): hits.append(ast.get_source_segment(source, n))
    return hits


def test_the_checker_finds_run_path_joins():
    code = ("a = Path(d) / 'runs' / f'{c}-s{s}'\nb = out / 'results.csv.sha256'\nc = p.joinpath('train', 'config.json')\n"
            "d = Path(x, 'model')\ne = sorted(p.glob('*/results.csv'))\nf = os.path.join(x, 'meta.json')\n"
            "g = out / 'analysis.csv'\nh = root / 'val'\n")
    hits = run_path_joins(ast.parse(code), code)
    assert len(hits) == 7 and not any('analysis' in h or "'val'" in h for h in hits), hits


def test_only_rundir_joins_run_directory_paths():
    found = {}
    for p in sorted((ROOT / 'pe_anchors').rglob('*.py')):
        rel = str(p.relative_to(ROOT / 'pe_anchors'))
        if rel in ('rundir.py', '_modidx.py') or rel in OTHER_KINDS: continue
        src = p.read_text()
        for h in run_path_joins(ast.parse(src), src):
            key = (rel, re.sub(r'\s+', ' ', h))
            found[key] = found.get(key, 0) + 1
    assert found == ALLOWED, '\n'.join(f'{k}: {v}' for k, v in found.items() if ALLOWED.get(k) != v)
