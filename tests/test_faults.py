"""Faults and misuse: every case ends with nothing lost, nothing executed and a message naming what is wrong.

Kills at chosen points of every write, torn / duplicated / stale / foreign files, two writers, a full or read-only
disk (simulated by patching, since the tests run as a user that can write everywhere), a planted pickle payload, and
the inputs that used to give silent wrong answers."""
import errno, json, multiprocessing as mp, os, subprocess, sys, warnings
from pathlib import Path

import pytest
import torch

import pe_anchors  # noqa: F401
from pe_anchors.core import read_json, write_atomic
from pe_anchors.data import digits
from pe_anchors.experiment import EvalData, check_run, preset, run_experiment, run_one
from pe_anchors.learner import checkpoints, last_checkpoint, pe_learner, train
from pe_anchors.results import gather, result_frame, write_results

from conftest import FAST, stop_after, weights


def _weights(out): return weights(out['learn'].model)


# ---------------------------------------------------------------- 1. code execution on resume
class _Payload:
    def __reduce__(self): return (os.system, (f"touch {os.environ['PAYLOAD_FLAG']}",))


def test_a_planted_pickle_payload_is_not_executed(small, tmp_path, monkeypatch):
    flag = tmp_path / 'pwned'
    monkeypatch.setenv('PAYLOAD_FLAG', str(flag))
    run = tmp_path / 'run'
    with pytest.raises(KeyboardInterrupt): train('ape', small, run_dir=run, epochs=3, cbs=[stop_after(1)], **FAST)
    for ck in checkpoints(run): torch.save({'epoch': 0, 'evil': _Payload()}, ck / 'state.pt')
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter('always')
        out = train('ape', small, run_dir=run, epochs=3, **FAST)
    assert not flag.exists()                                                    # nothing was executed
    assert out['learn'].resume_epoch == 0 and any('unreadable' in str(x.message) for x in w)   # said, and restarted


# ---------------------------------------------------------------- 2. kills leave resumable runs
def test_a_torn_newest_checkpoint_falls_back_to_the_previous_one(small, tmp_path):
    full = train('rpt', small, run_dir=tmp_path / 'full', epochs=4, **FAST)
    with pytest.raises(KeyboardInterrupt): train('rpt', small, run_dir=tmp_path / 'cut', epochs=4, cbs=[stop_after(2)], **FAST)
    newest = last_checkpoint(tmp_path / 'cut')
    assert newest.name == 'epoch_002' and len(checkpoints(tmp_path / 'cut')) == 2
    (newest / 'state.pt').write_bytes((newest / 'state.pt').read_bytes()[:100])           # killed mid-write
    with warnings.catch_warnings(): warnings.simplefilter('ignore'); resumed = train('rpt', small, run_dir=tmp_path / 'cut', epochs=4, **FAST)
    assert resumed['learn'].resume_epoch == 2                                  # from epoch_001, the previous good one
    wf, wr = _weights(full), _weights(resumed)
    assert all(torch.equal(wf[k], wr[k]) for k in wf)                          # and bit-identical to the uninterrupted run


def test_a_zero_byte_final_json_is_rebuilt(small, tmp_path):
    run = tmp_path / 'run'
    train('ape', small, run_dir=run, epochs=1, **FAST)
    (run / 'final.json').write_text('')
    with warnings.catch_warnings(): warnings.simplefilter('ignore'); out = train('ape', small, run_dir=run, epochs=1, **FAST)
    assert 0 <= out['accuracy'] <= 1 and read_json(run / 'final.json')['epochs'] == 1


def test_a_torn_metrics_line_is_named(small, tmp_path):
    run = tmp_path / 'run'
    with pytest.raises(KeyboardInterrupt): train('ape', small, run_dir=run, epochs=3, cbs=[stop_after(1)], **FAST)
    m = run / 'metrics.csv'
    m.write_text(m.read_text() + '2,1.2')                                      # a torn line
    with pytest.raises(ValueError, match='metrics.csv is torn'): train('ape', small, run_dir=run, epochs=3, **FAST)


def test_writes_are_atomic_under_a_full_disk(tmp_path, monkeypatch):
    p = write_atomic(tmp_path / 'a.json', '{"ok": 1}')
    def full(*a): raise OSError(errno.ENOSPC, 'No space left on device')
    monkeypatch.setattr(os, 'fsync', full)
    with pytest.raises(OSError): write_atomic(p, '{"ok": 2}')
    assert read_json(p) == {'ok': 1} and [f.name for f in tmp_path.iterdir()] == ['a.json']   # old file whole, no temp


# ---------------------------------------------------------------- 3. concurrent writers
def _hammer(path, k, n):
    from pe_anchors.core import read_json, write_atomic
    bad = 0
    for i in range(n):
        write_atomic(path, json.dumps({'writer': k, 'i': i, 'pad': 'x' * 2000}))
        try: read_json(path)
        except ValueError: bad += 1
    return bad


def test_two_writers_never_tear_a_file(tmp_path):
    ctx = mp.get_context('spawn')
    with ctx.Pool(2) as pool: bad = pool.starmap(_hammer, [(tmp_path / 'f.json', k, 300) for k in range(2)])
    assert bad == [0, 0] and len(list(tmp_path.iterdir())) == 1


def test_a_locked_run_is_left_to_its_owner(tmp_path, capsys):
    exp = preset('digits', conditions=['ape'], train_kwargs=dict(epochs=1), ssdc_images=32, n_perms=1, alphas=[])
    data = digits()
    ev = EvalData(data, 32, 64, 'cpu')
    run_dir = tmp_path / 'runs' / 'ape-s0'
    probe = f"from pe_anchors.core import RunLock; import time\nwith RunLock({str(run_dir)!r}) as l: print(l.acquired, flush=True); time.sleep(20)"
    holder = subprocess.Popen([sys.executable, '-c', probe], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == 'True'
        assert run_one(exp, data, ev, 'ape', 0, run_dir, device='cpu', show=False) is None
        assert 'another process is running it' in capsys.readouterr().out and not (run_dir / 'results.csv').exists()
    finally: holder.kill()


# ---------------------------------------------------------------- 4. results merged with checks
def test_gather_refuses_torn_duplicated_and_foreign_runs(tmp_path):
    for c in ('ape', 'nope'):
        write_results(result_frame([dict(metric='acc', value=.5)], condition=c), tmp_path / 'runs' / f'{c}-s0' / 'results.csv')
    assert len(gather(tmp_path)) == 2
    f = tmp_path / 'runs' / 'ape-s0' / 'results.csv'
    good = f.read_bytes(); f.write_bytes(good[:-5])
    with pytest.raises(ValueError, match=r'ape-s0/results.csv does not match its checksum'): gather(tmp_path)
    f.write_bytes(good)
    write_results(result_frame([dict(metric='acc', value=.5)], condition='ape'), tmp_path / 'runs' / 'ape-copy' / 'results.csv')
    with pytest.raises(ValueError, match='duplicate result rows.*ape-copy'): gather(tmp_path)


def test_a_run_from_another_experiment_is_refused(small, tmp_path):
    exp = preset('digits', conditions=['ape'], train_kwargs=dict(epochs=1, bs=64))
    train('ape', small, run_dir=tmp_path / 'ape-s1' / 'train', epochs=1, bs=64, lr=5e-3, show_progress=False)   # other lr
    with pytest.raises(ValueError, match=r"trained with another setting \(differs in .*recipe\.lr"):
        check_run(exp, tmp_path / 'ape-s1')


# ---------------------------------------------------------------- 6. the robustness cache
def test_the_shift_cache_follows_the_content_and_its_checksum(tmp_path):
    from pe_anchors.robustness import JPEG, TensorBatches, shifted_set
    x = torch.randint(0, 256, (40, 3, 16, 16), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    y = torch.arange(40) % 10
    a, _ = shifted_set(TensorBatches(x, y, 16), JPEG(20), cache_dir=tmp_path, dataset_id='d')
    more = torch.cat([x, x[:20]]), torch.cat([y, y[:20]])                       # the folder grew
    b, _ = shifted_set(TensorBatches(*more, 16), JPEG(20), cache_dir=tmp_path, dataset_id='d')
    assert len(b) == 60 and len(list(tmp_path.glob('*.safetensors'))) == 2
    f = sorted(tmp_path.glob('*.safetensors'), key=lambda p: p.stat().st_size)[0]
    raw = bytearray(f.read_bytes()); raw[-3] ^= 0xFF; f.write_bytes(bytes(raw))  # flipped bits
    with pytest.warns(UserWarning, match='damaged cache file'):
        c, _ = shifted_set(TensorBatches(x, y, 16), JPEG(20), cache_dir=tmp_path, dataset_id='d')
    assert torch.equal(a, c)


# ---------------------------------------------------------------- 7. silent wrong answers become errors
def test_inputs_that_used_to_give_silent_wrong_answers(small):
    from pe_anchors.vit import PEViT
    from pe_anchors.robustness import evaluate_accuracy
    from pe_anchors.interventions import measure_ssdc
    with pytest.raises(ValueError, match='larger than the 256 training images'): pe_learner(small, 'ape', bs=512, show_progress=False)
    with pytest.raises(ValueError, match='not a multiple of patch_size'): PEViT(img_size=18, patch_size=4)
    m = PEViT(img_size=16, patch_size=2, embed_dim=32, depth=2, num_heads=2, num_classes=10).eval()
    x = small.valid.images[:8]
    with pytest.raises(ValueError, match='labels outside 0..9'): evaluate_accuracy(m, [(x, torch.full((8,), 12))], small.normalize)
    with torch.no_grad(): m.head.weight.fill_(float('nan'))
    with pytest.raises(ValueError, match='not finite'): evaluate_accuracy(m, [(x, torch.zeros(8, dtype=torch.long))], small.normalize)
    with pytest.raises(ValueError, match='does not match the model'): measure_ssdc(m, [small.normalize(x)], grid_size=4)


def test_a_diverging_run_stops_with_a_message(small, tmp_path):
    with pytest.raises(ValueError, match='training diverged at epoch 0'):
        train('ape', small, run_dir=tmp_path / 'run', epochs=2, lr=1e6, **FAST)
    assert not (tmp_path / 'run' / 'final.json').exists()


# ---------------------------------------------------------------- 8. late failures and locked directories
def test_bad_experiments_fail_before_anything_is_written(tmp_path):
    bad = [dict(train_kwargs=dict(epochs=1, lrr=1)), dict(model_kwargs=dict(depth=1)), dict(model_kwargs=dict(dept=2))]
    for kw, msg in zip(bad, ('unknown recipe field', 'needs at least 2', 'do not fit')):    # refused when made, or when run
        with pytest.raises(ValueError, match=msg): run_experiment(preset('digits', **kw), tmp_path / 'e', device='cpu', show=False)
        assert not (tmp_path / 'e' / 'experiment.json').exists()
    with pytest.raises(ValueError, match="shard must be"): run_experiment(preset('digits'), tmp_path / 'e', shard='x')
    assert not (tmp_path / 'e').exists()


# ---------------------------------------------------------------- 9. environment errors from the command line
def test_environment_errors_are_one_line(tmp_path, small):
    env = {**os.environ, 'PE_ANCHORS_QUIET': '1'}
    run = lambda *a: subprocess.run(['pe_anchors', *a], capture_output=True, text=True, env=env, timeout=300)
    (tmp_path / 'bad.yaml').write_text('name: [unclosed')
    r = run('sweep', str(tmp_path / 'bad.yaml'), '--out', str(tmp_path / 'o'))
    assert r.returncode == 2 and 'Traceback' not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    import timm
    from pe_anchors.vit import save_checkpoint
    m = timm.create_model('pe_vit_nano_patch2_16', pe='ape')
    save_checkpoint(m, tmp_path / 'm.safetensors')
    from safetensors.torch import load_file, save_file
    from safetensors import safe_open
    with safe_open(str(tmp_path / 'm.safetensors'), 'pt') as f: meta = f.metadata()
    sd = load_file(str(tmp_path / 'm.safetensors')); sd.pop('head.weight')
    save_file(sd, str(tmp_path / 'm.safetensors'), metadata=meta)               # a mismatched checkpoint
    r = run('analyze', str(tmp_path / 'm.safetensors'), '--condition', 'ape', '--out', str(tmp_path / 'a'))
    assert r.returncode == 2 and 'does not match its own model config' in r.stderr and 'Traceback' not in r.stderr


def test_report_from_a_read_only_experiment_directory(tmp_path, monkeypatch):
    from pe_anchors.testing import synthetic_results
    from pe_anchors.report import write_report
    exp_dir = tmp_path / 'exp'
    write_results(synthetic_results(seeds=(0,)), exp_dir / 'runs' / 'all-s0' / 'results.csv')
    import pe_anchors.core as core
    real = core.write_atomic
    def guarded(path, data):
        if Path(path).resolve().is_relative_to(exp_dir.resolve()): raise OSError(errno.EROFS, 'Read-only file system', str(path))
        return real(path, data)
    for mod in ('pe_anchors.core', 'pe_anchors.results', 'pe_anchors.report'): monkeypatch.setattr(f'{mod}.write_atomic', guarded)
    p = write_report(exp_dir, tmp_path / 'elsewhere')
    assert p.exists() and not (exp_dir / 'results.csv').exists()


def test_created_files_follow_the_umask(small, tmp_path):
    old = os.umask(0o022)
    try:
        train('ape', small, run_dir=tmp_path / 'run', epochs=1, **FAST)
        modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / 'run').rglob('*') if p.name != '.lock'}
    finally: os.umask(old)
    assert modes['config.json'] == 0o644 and modes['model.safetensors'] == 0o644 and modes['epoch_000'] == 0o755
