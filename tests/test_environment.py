"""The machine and the shell around the command line: an ASCII locale, a closed pipe, launcher and Slurm variables,
a busy target, a full disk, a checkpoint that is a pickle. Each ends in one line that names the thing (or, for a
closed pipe, quietly), never in a traceback."""
import errno, json, os, subprocess, sys
from pathlib import Path

import pytest

from conftest import ROOT, cli, exp_file

ENV = {**os.environ, 'PE_ANCHORS_QUIET': '1', 'PYTHONWARNINGS': 'ignore'}


def _run(*args, env=None, **kw):
    return subprocess.run([sys.executable, '-m', 'pe_anchors.cli', *map(str, args)], capture_output=True, text=True,
                          env={**ENV, **(env or {})}, timeout=600, **kw)


def test_an_ascii_locale_runs_every_command(tmp_path):
    "LC_ALL=C without Python's UTF-8 mode: sweep, report and analyze print their ×, ± and ρ as '?' and write UTF-8 files."
    ascii_env = {'LC_ALL': 'C', 'LANG': 'C', 'PYTHONUTF8': '0', 'PYTHONIOENCODING': ''}
    (tmp_path / 'cfg').mkdir()
    for args in (('sweep', exp_file(tmp_path / 'cfg'), '--out', tmp_path / 'o', '--workers', '1'),
                 ('report', tmp_path / 'o'),
                 ('analyze', tmp_path / 'o' / 'runs' / 'ape-s0', '--ssdc-images', '16', '--n-perms', '1', '--out', tmp_path / 'a')):
        r = _run(*args, env=ascii_env)
        assert r.returncode == 0 and 'Traceback' not in r.stderr, (args[0], r.stderr[-2000:])
    assert 'ΔSSDC' in (tmp_path / 'o' / 'report' / 'report.md').read_text(encoding='utf-8')   # the files stay UTF-8


def test_a_closed_pipe_ends_quietly(tmp_path):
    "`pe_anchors report ... | head -1`: the reader leaves after one line; the command stops without a word."
    r = subprocess.run(f"{sys.executable} -m pe_anchors.cli report {ROOT / 'nbs/results/digits/results.csv'} "
                       f"--dest {tmp_path / 'rep'} | head -1", shell=True, capture_output=True, text=True, env=ENV, timeout=600)
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 1 and r.stderr.strip() == '', r.stderr


@pytest.mark.parametrize('env, words', [
    (dict(WORLD_SIZE='1.5'), ["WORLD_SIZE='1.5' is not a whole number"]),
    (dict(WORLD_SIZE='0'), ['WORLD_SIZE=0 is outside >= 1']),
    (dict(WORLD_SIZE='-1'), ['WORLD_SIZE=-1 is outside >= 1']),
    (dict(WORLD_SIZE='2', RANK='abc'), ["RANK='abc' is not a whole number (0..1)"]),
    (dict(WORLD_SIZE='2', RANK='2'), ['RANK=2 is outside 0..1']),
    (dict(SLURM_ARRAY_TASK_ID='0', SLURM_ARRAY_TASK_COUNT='abc'), ["SLURM_ARRAY_TASK_COUNT='abc' is not a whole number"]),
    (dict(SLURM_ARRAY_TASK_ID='x'), ["SLURM_ARRAY_TASK_ID='x' is not a whole number"])],
    ids=['world-1.5', 'world-0', 'world-minus-1', 'rank-abc', 'rank-out-of-range', 'slurm-count-abc', 'slurm-id-x'])
def test_launcher_variables_are_checked_and_named(tmp_path, capsys, monkeypatch, env, words):
    for k in ('WORLD_SIZE', 'RANK', 'LOCAL_RANK') + tuple(k for k in os.environ if k.startswith('SLURM_')): monkeypatch.delenv(k, raising=False)
    for k, v in env.items(): monkeypatch.setenv(k, v)
    rc, err = cli(capsys, 'sweep', exp_file(tmp_path), '--out', tmp_path / 'o', '--shard', 'auto', '--quiet')
    assert rc == 2 and all(w in err for w in words) and 'fix or unset it' in err, err
    assert not (tmp_path / 'o').exists()                                      # before anything is written
    if 'WORLD_SIZE' in env and 'RANK' not in env:                               # training alone reads it too
        rc, err = cli(capsys, 'train', '--out', tmp_path / 'r', '--epochs', '1', '--quiet')
        assert rc == 2 and all(w in err for w in words), err


def test_a_busy_mount_point_is_filled_not_renamed_onto(tmp_path, monkeypatch):
    "`export` onto an empty mount point: the folder cannot be renamed onto it (EBUSY), so its files are moved in."
    import timm
    import pe_anchors.hub as hub
    target = tmp_path / 'mnt'; target.mkdir()
    real = os.replace
    def replace(src, dst):
        if Path(dst) == target: raise OSError(errno.EBUSY, 'Device or resource busy', str(dst))
        return real(src, dst)
    monkeypatch.setattr(hub.os, 'replace', replace)
    out = hub.save_hub(timm.create_model('pe_vit_nano_patch2_16', pe='ape', num_classes=10), target)
    assert sorted(p.name for p in out.iterdir()) == ['README.md', 'config.json', 'model.safetensors']
    assert sorted(p.name for p in tmp_path.iterdir()) == ['mnt']                 # no staging folder left
    full = tmp_path / 'full'; full.mkdir()                                      # a mount that fills up after the first file
    moved = []
    def move(src, dst):
        if moved: raise OSError(errno.ENOSPC, 'No space left on device', src)   # shutil names the source
        moved.append(dst); Path(dst).write_bytes(b'part')
    monkeypatch.setattr(hub.shutil, 'move', move)
    monkeypatch.setattr(hub.os, 'replace', lambda s, d: replace(s, target) if Path(d) == full else real(s, d))
    with pytest.raises(OSError, match='No space left on device') as e:
        hub.save_hub(timm.create_model('pe_vit_nano_patch2_16', pe='ape', num_classes=10), full)
    assert e.value.filename == str(full) and moved and list(full.iterdir()) == []   # the folder named, left empty as it was
    assert sorted(p.name for p in tmp_path.iterdir()) == ['full', 'mnt']


def test_a_busy_or_full_target_is_named_in_one_line(tmp_path, capsys, monkeypatch):
    "An error of the file system without a path (a write to a full disk) names the command's output folder, and what to do."
    import pe_anchors.report as rep
    from pe_anchors.testing import synthetic_results
    p = tmp_path / 'r.csv'; synthetic_results(seeds=(0,)).to_csv(p, index=False)
    for code, words in ((errno.ENOSPC, ['No space left on device', 'rep', 'free some space']),
                        (errno.EBUSY, ['busy', 'give a folder inside it'])):
        def full(*a, code=code, **k): raise OSError(code, os.strerror(code))
        monkeypatch.setattr(rep, '_write', full)
        rc, err = cli(capsys, 'report', p, '--dest', tmp_path / 'rep')
        assert rc == 2 and all(w in err for w in words) and '?' not in err, err


def test_a_checkpoint_that_is_a_pickle_is_never_run(tmp_path, capsys):
    "A sweep resuming from a state.pt that is a pickle (running code when loaded): refused as data, the run retrained, one warning line."
    import torch
    (tmp_path / 'cfg').mkdir()
    e, out = exp_file(tmp_path / 'cfg', conditions=['ape']), tmp_path / 'o'
    rc, err = cli(capsys, 'sweep', e, '--out', out, '--workers', '1', '--quiet')
    assert rc == 0, err
    run = out / 'runs' / 'ape-s0'
    class Planted:
        def __reduce__(self): return (os.system, (f'touch {tmp_path / "planted"}',))
    for ck in (run / 'train' / 'checkpoints').iterdir(): torch.save({'x': Planted()}, ck / 'state.pt')
    (run / 'results.csv').unlink(); (run / 'train' / 'final.json').unlink()
    rc, err = cli(capsys, 'sweep', e, '--out', out, '--workers', '1', '--quiet')
    assert rc == 0 and 'warning' in err and 'unreadable' in err, err
    assert not (tmp_path / 'planted').exists() and (run / 'results.csv').exists()


ISA_ENV = ('MKL_CBWR', 'ONEDNN_MAX_CPU_ISA', 'DNNL_MAX_CPU_ISA', 'ATEN_CPU_CAPABILITY')


def test_a_cpu_isa_too_late_is_refused_in_one_line(capsys, monkeypatch):
    "In a process whose torch kernels have computed already, the code paths cannot be pinned any more: said in one line."
    import torch
    for k in ISA_ENV: monkeypatch.setenv(k, 'x'); monkeypatch.delenv(k)           # unset now, put back as they were afterwards
    torch.ones(3) + 1                                                            # torch has chosen its kernels
    if torch.backends.cpu.get_cpu_capability().lower() == 'avx2': pytest.skip('this CPU uses AVX2 already')
    rc, err = cli(capsys, '--cpu-isa', 'avx2', 'bench', 'ssdc', '--quick', '--quiet')
    assert rc == 2 and 'already use' in err and 'ATEN_CPU_CAPABILITY=avx2' in err, err
    # refused, the environment is as it was: a process started from this one later (a sweep's worker) must not run
    # pinned kernels while this one runs the native ones (their numbers would differ on a CPU wider than AVX2)
    assert [k for k in ISA_ENV if k in os.environ] == [], {k: os.environ[k] for k in ISA_ENV if k in os.environ}


def test_a_cpu_isa_in_a_new_process_pins_the_kernels(tmp_path):
    "`--cpu-isa avx2`: torch's own kernels use AVX2 (recorded with the run) and MKL's and oneDNN's variables are set."
    r = _run('--cpu-isa', 'avx2', 'train', '--out', tmp_path / 'r', '--epochs', '1', '--bs', '256', '--quiet')
    assert r.returncode == 0, r.stderr[-2000:]
    cpu = json.loads((tmp_path / 'r' / 'config.json').read_text())['cpu']
    assert cpu['capability'] == 'AVX2', cpu
    assert cpu['env'] == {'MKL_CBWR': 'AVX2', 'ONEDNN_MAX_CPU_ISA': 'AVX2', 'DNNL_MAX_CPU_ISA': 'AVX2', 'ATEN_CPU_CAPABILITY': 'avx2'}
