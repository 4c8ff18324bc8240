"""Deterministic runs: every run computes with one torch thread count for its whole life (one unless asked, recorded
with its CPU), so the same run gives the same table however busy the machine is; the command line uses the free cores
by training runs side by side in worker processes; `--threads` is bounded by the cores; a one-line hint when busy."""
import json, subprocess, sys, time

import pandas as pd
import pytest
import torch

import pe_anchors.cli as cli
import pe_anchors.core as core
from pe_anchors.learner import train

from conftest import FAST, cli as run_cli, exp_file


@pytest.fixture(autouse=True)
def _restore_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def busy(monkeypatch, cores: float):
    monkeypatch.setattr(core, 'busy_cores', lambda since=None, window=.2: cores)


COMMANDS = (['demo'], ['train', '--out', 'r'], ['analyze', 'm.safetensors'], ['sweep', 'digits', '--out', 'o'],
            ['atlas', 'vit_tiny_patch16_224'], ['bench', 'ssdc'])


def test_every_command_that_computes_takes_threads_bounded_by_the_cores(capsys):
    for cmd in COMMANDS:
        assert cli.parser().parse_args(cmd).threads == ('auto' if cmd[0] == 'bench' else None), cmd   # one per run; a benchmark: free cores
        assert cli.parser().parse_args(cmd + ['--threads', '1']).threads == 1, cmd
        assert cli.parser().parse_args(cmd + ['--threads', 'auto']).threads == 'auto', cmd
    for bad in ('0', 'two', str(core.usable_cores() + 1), '100000', '99999999'):
        with pytest.raises(SystemExit): cli.parser().parse_args(['bench', 'ssdc', '--threads', bad])
    err = capsys.readouterr().err
    assert f'is more than the {core.usable_cores()} core(s) this process may use' in err, err
    assert not hasattr(cli.parser().parse_args(['report', 'x']), 'threads')      # report does not compute
    for cmd in (['demo'], ['sweep', 'digits', '--out', 'o']):
        assert cli.parser().parse_args(cmd).workers == 'auto'
        assert cli.parser().parse_args(cmd + ['--workers', '1']).workers == 1


def test_threads_reach_torch_from_the_command_line(capsys):
    torch.set_num_threads(core.usable_cores())
    assert cli.main(['bench', 'shifts', '--quick', '--device', 'cpu', '--threads', '1', '--quiet']) == 0
    assert torch.get_num_threads() == 1
    assert cli.main(['bench', 'shifts', '--quick', '--device', 'cpu', '--quiet']) == 0       # a benchmark's default: auto
    assert 1 <= torch.get_num_threads() <= core.usable_cores()


def test_a_run_keeps_its_thread_count_for_its_whole_life(small, tmp_path):
    from conftest import stop_after
    torch.set_num_threads(1)
    with pytest.raises(KeyboardInterrupt): train('ape', small, run_dir=tmp_path, epochs=2, threads=1, cbs=[stop_after(0)], **FAST)
    cfg = json.loads((tmp_path / 'config.json').read_text())
    assert cfg['threads'] == 1 and cfg['cpu']['capability'] == torch.backends.cpu.get_cpu_capability()
    if core.usable_cores() > 1:                                               # another count on resume: refused, nothing changed
        with pytest.raises(ValueError, match=r'was trained with 1 torch thread\(s\): resume it with --threads 1'):
            train('ape', small, run_dir=tmp_path, epochs=2, threads=2, **FAST)
        torch.set_num_threads(2)
    out = train('ape', small, run_dir=tmp_path, epochs=2, threads='auto', **FAST)   # 'auto' (or None): the recorded count
    assert torch.get_num_threads() == 1 and '1 torch threads' in out['hardware']


def test_the_load_never_changes_a_run_while_it_trains(small, monkeypatch):
    "The machine's load is read at most once, at the start of a run given 'auto' (no callback follows it each epoch)."
    from fastai.callback.core import Callback
    calls, seen = [], []
    monkeypatch.setattr(core, 'busy_cores', lambda since=None, window=.2: calls.append(1) or 0.)
    class Seen(Callback):
        def before_epoch(self): seen.append(torch.get_num_threads())
    train('ape', small, epochs=3, threads='auto', cbs=[Seen()], **FAST)
    assert len(calls) == 1 and len(set(seen)) == 1, (calls, seen)


def test_the_same_run_gives_the_same_table_beside_a_busy_process(tmp_path, capsys):
    """A tiny sweep twice, with the command line's defaults: the second time beside a process that keeps a core busy,
    and with its runs trained one at a time instead of side by side. The tables are identical."""
    (tmp_path / 'cfg').mkdir()
    e = exp_file(tmp_path / 'cfg')
    rc, err = run_cli(capsys, 'sweep', e, '--out', tmp_path / 'a', '--workers', str(min(2, core.usable_cores())), '--quiet')
    assert rc == 0, err
    hog = subprocess.Popen([sys.executable, '-c', 'while True: pass'])
    try:
        time.sleep(.3)
        rc, err = run_cli(capsys, 'sweep', e, '--out', tmp_path / 'b', '--workers', '1', '--quiet')
    finally: hog.kill(); hog.wait()
    assert rc == 0, err
    a, b = (pd.read_csv(tmp_path / d / 'results.csv') for d in 'ab')
    pd.testing.assert_frame_equal(a, b)                                        # every value to the last bit
    for d in 'ab':
        rec = json.loads((tmp_path / d / 'runs' / 'ape-s0' / 'run.json').read_text())
        assert rec['threads'] == 1 and rec['cpu']['threads'] == 1 and rec['cpu']['model'] == core.cpu_name()
        assert rec['protocol']['ssdc_images'] == 32 and rec['protocol']['n_perms'] == 1


def test_a_sweep_runs_one_worker_per_free_core(monkeypatch):
    from pe_anchors.sweep import _workers
    monkeypatch.setattr(core, 'usable_cores', lambda: 8)
    import pe_anchors.sweep as sweep
    monkeypatch.setattr(sweep, 'free_cores', lambda busy=None: 6)               # two of the 8 cores busy elsewhere
    assert _workers('auto', None, 'cpu', 10) == 6 and _workers('auto', 2, 'cpu', 10) == 3
    assert _workers('auto', None, 'cpu', 4) == 4 and _workers('auto', None, 'cuda', 10) == 1
    assert _workers(None, None, 'cpu', 10) == 1 and _workers(3, None, 'cpu', 10) == 3 and _workers('auto', 'auto', 'cpu', 10) == 1


def test_a_busy_machine_gets_one_line_only_when_asked_in_tests(monkeypatch, capsys):
    busy(monkeypatch, 1.0)
    cli._threads(cli.parser().parse_args(['analyze', 'm.safetensors']))
    assert capsys.readouterr().err == ''                                      # never printed inside the test suite ...
    monkeypatch.setenv('PE_ANCHORS_LOAD_HINT', '1')                           # ... unless asked
    assert cli._threads(cli.parser().parse_args(['analyze', 'm.safetensors'])) is None and torch.get_num_threads() == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f'1.0 of {core.usable_cores()} cores are busy' in err[0] and 'keeps its 1 torch thread' in err[0], err
    cli._threads(cli.parser().parse_args(['analyze', 'm.safetensors', '--quiet']))
    assert capsys.readouterr().err == ''                                      # --quiet: nothing
    busy(monkeypatch, 0.3)
    cli._threads(cli.parser().parse_args(['analyze', 'm.safetensors']))
    assert capsys.readouterr().err == ''                                      # an idle machine: nothing


def test_the_load_check_is_cheap():
    t = time.perf_counter(); b = core.busy_cores(); dt = time.perf_counter() - t
    assert dt < 0.3 and 0 <= b <= core.usable_cores()
