"""pe_anchors.kept: a trained model loaded from a run at any of its levels (its kept model first), from a Hub folder or a
checkpoint, and a run that has none named; the kept runs of an experiment."""
import json

import pytest
import timm
import torch

import pe_anchors  # noqa: F401  (registers the pe_vit_* models)
from pe_anchors.config import preset
from pe_anchors.hub import save_checkpoint, save_hub
from pe_anchors.kept import kept_runs, load_kept, load_run_model, load_trained
from pe_anchors.rundir import ExperimentDir


@pytest.fixture
def experiment(tmp_path):
    "An experiment directory with run ape-s0: its final weights in train/ and, different ones, its kept model/."
    ed = ExperimentDir(tmp_path / 'exp')
    run = ed.run('ape', 0)
    torch.manual_seed(0)
    trained, kept = (timm.create_model('pe_vit_nano_patch1_8', pe='ape', num_classes=10).eval() for _ in range(2))
    save_checkpoint(trained, run.train.model)
    run.train.config.write_text(json.dumps(dict(condition='ape', seed=0, model='pe_vit_nano_patch1_8')))
    save_hub(kept, run.kept)
    run.results.write_text('x'); run.record.write_text(json.dumps(dict(condition='ape', seed=0)))
    ed.experiment.write_text(json.dumps(preset('digits', conditions=['ape']).to_dict()))
    return ed, trained, kept


def test_a_run_is_loaded_from_any_of_its_levels(experiment, tmp_path):
    ed, trained, kept = experiment
    run, x = ed.run('ape', 0), torch.randn(2, 3, 8, 8)
    for level in (run.path, run.train.path, run.kept, run.train.model, run.kept / 'model.safetensors'):
        model, cfg = load_trained(level)
        assert torch.equal(model(x), kept(x)) and cfg['condition'] == 'ape', level    # the kept model, the run's config
    assert torch.equal(load_run_model(ed.path, 'ape', 0)(x), kept(x))
    assert kept_runs(ed.path) == [('ape', 0)]
    hub = save_hub(trained, tmp_path / 'elsewhere')                                   # a Hub folder of no run
    model, cfg = load_trained(hub)
    assert torch.equal(model(x), trained(x)) and cfg == {}
    import shutil; shutil.rmtree(run.kept)                                           # no kept model: the final weights
    assert torch.equal(load_trained(run.path)[0](x), trained(x))
    run.train.model.unlink()
    with pytest.raises(FileNotFoundError, match='neither a kept model nor final weights'): load_trained(run.path)
    with pytest.raises(FileNotFoundError, match='has no final model'): load_run_model(ed.path, 'ape', 0)
    with pytest.raises(FileNotFoundError, match=r'no kept model of run ape-s0 \(kept: none\)'): load_kept(ed.path, 'ape', 0)


def test_every_committed_model_has_its_weights_and_git_keeps_them():
    """A Hub folder committed without its weights (an ignore rule that missed its path) is a model lost with the machine
    that trained it: every committed Hub config has its weights beside it, and no place a kept model goes is ignored."""
    import shutil, subprocess
    from pathlib import Path
    from pe_anchors.rundir import CONFIG, MODEL_FILE
    root = Path(__file__).resolve().parents[1]
    results = root / 'nbs' / 'results'
    hubs = [p.parent for p in results.rglob(CONFIG) if 'architecture' in json.loads(p.read_text())]
    assert len(hubs) >= 30                                                           # the kept CIFAR-10 runs
    assert [str(h.relative_to(root)) for h in hubs if not (h / MODEL_FILE).is_file()] == []
    if not (shutil.which('git') and (root / '.git').exists()): pytest.skip('not a git checkout: the ignore rules are not checked')
    where = [h / MODEL_FILE for h in hubs] + [ExperimentDir(e).run('any', 0).kept / MODEL_FILE for e in results.iterdir() if e.is_dir()]
    r = subprocess.run(['git', 'check-ignore', '--no-index', *map(str, where)], cwd=root, capture_output=True, text=True)
    assert r.returncode in (0, 1) and r.stdout == '', f"ignored by git: {r.stdout}"


def test_every_committed_model_card_agrees_with_its_results_table():
    "A kept model's card (config.json) says what `run_card` reads from the run's committed results table, row for row."
    from pathlib import Path
    from pe_anchors.hub import run_card
    from pe_anchors.results import read_results
    results = Path(__file__).resolve().parents[1] / 'nbs' / 'results'
    runs = [h.parent for h in sorted(results.glob('*/runs/*/model')) if (h.parent / 'results.csv').exists()]
    if not runs: pytest.skip(f"no kept models with results tables under {results}")
    stale = []
    for run in runs:
        card = json.loads((run / 'model' / 'config.json').read_text())['pe_anchors'].get('card', {})
        condition, seed = run.name.rsplit('-s', 1)
        want = run_card(dict(condition=condition, seed=int(seed)), read_results(run / 'results.csv'))
        stale += [f"  {run.relative_to(results)}: {k}: {card.get(k)!r}, table says {v!r}" for k, v in want.items() if card.get(k) != v]
    assert not stale, "model cards that disagree with their results tables (rebuild them with run_card):\n" + '\n'.join(stale)
