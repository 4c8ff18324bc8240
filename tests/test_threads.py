"""Under load: `--threads` on every command that computes, torch threads chosen from the cores other processes leave
free (at start and each epoch), and a one-line hint when the machine is busy."""
import dataclasses, time

import pytest
import torch
from fastai.callback.core import Callback

import pe_anchors.cli as cli
import pe_anchors.core as core
import pe_anchors.learner as L
from pe_anchors.data import ImageSplit, digits


@pytest.fixture(autouse=True)
def _restore_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


@pytest.fixture
def four_cores(monkeypatch):
    "A machine with 4 usable cores, whatever this one has."
    monkeypatch.setattr(core, 'usable_cores', lambda: 4)
    monkeypatch.setattr(core, '_TORCH_THREADS', 4)


def busy(monkeypatch, cores: float):
    monkeypatch.setattr(core, 'busy_cores', lambda since=None, window=.2: cores)


COMMANDS = (['demo'], ['train', '--out', 'r'], ['analyze', 'm.safetensors'], ['sweep', 'digits', '--out', 'o'],
            ['atlas', 'vit_tiny_patch16_224'], ['bench', 'ssdc'])


def test_every_command_that_computes_takes_threads():
    for cmd in COMMANDS:
        assert cli.parser().parse_args(cmd).threads == 'auto', cmd
        assert cli.parser().parse_args(cmd + ['--threads', '3']).threads == 3, cmd
    for bad in ('0', 'two'):
        with pytest.raises(SystemExit): cli.parser().parse_args(['bench', 'ssdc', '--threads', bad])
    assert not hasattr(cli.parser().parse_args(['report', 'x']), 'threads')      # report does not compute


def test_threads_reach_torch_from_the_command_line(capsys):
    assert cli.main(['bench', 'shifts', '--quick', '--device', 'cpu', '--threads', '1', '--quiet']) == 0
    assert torch.get_num_threads() == 1


def test_auto_leaves_the_busy_cores_alone(monkeypatch, four_cores):
    for load, want in ((0., 4), (0.4, 4), (1.0, 3), (2.6, 1), (7., 1)):
        busy(monkeypatch, load)
        assert cli._threads(cli.parser().parse_args(['bench', 'ssdc', '--quiet'])) == 'auto'
        assert torch.get_num_threads() == want, load
    monkeypatch.setattr(core, '_TORCH_THREADS', 2)                            # never more than torch's own default
    busy(monkeypatch, 0.); cli._threads(cli.parser().parse_args(['bench', 'ssdc', '--quiet']))
    assert torch.get_num_threads() == 2


def test_a_busy_machine_gets_one_line_only_when_asked_in_tests(monkeypatch, capsys, four_cores):
    busy(monkeypatch, 1.0)
    cli._threads(cli.parser().parse_args(['bench', 'ssdc']))
    assert capsys.readouterr().err == ''                                      # never printed inside the test suite ...
    monkeypatch.setenv('PE_ANCHORS_LOAD_HINT', '1')                           # ... unless asked
    cli._threads(cli.parser().parse_args(['bench', 'ssdc']))
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and '1.0 of 4 cores are busy' in err[0] and 'torch uses 3 thread(s)' in err[0], err
    cli._threads(cli.parser().parse_args(['bench', 'ssdc', '--threads', '4']))
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and '--threads 4' in err[0] and '--threads auto' in err[0], err
    cli._threads(cli.parser().parse_args(['bench', 'ssdc', '--quiet']))
    assert capsys.readouterr().err == ''                                      # --quiet: nothing
    busy(monkeypatch, 0.3)
    cli._threads(cli.parser().parse_args(['bench', 'ssdc']))
    assert capsys.readouterr().err == ''                                      # an idle machine: nothing


def test_the_load_check_is_cheap():
    t = time.perf_counter(); b = core.busy_cores(); dt = time.perf_counter() - t
    assert dt < 0.3 and 0 <= b <= core.usable_cores()


def test_training_follows_the_load_each_epoch(monkeypatch, four_cores):
    d = digits()
    small = dataclasses.replace(d, train=ImageSplit(d.train.labels[:128], images=d.train.images[:128]),
                                valid=ImageSplit(d.valid.labels[:32], images=d.valid.images[:32]))
    loads = iter([2.0, 0.0, 3.0])                                             # measured over epochs 0, 1, 2
    monkeypatch.setattr(L, 'busy_cores', lambda since=None, window=.2: next(loads))
    seen = []
    class Seen(Callback):
        order = 2                                                             # after AutoThreads
        def before_epoch(self): seen.append(torch.get_num_threads())          # (the final validate adds one)
    torch.set_num_threads(4)
    L.train('ape', small, epochs=4, bs=64, model_kwargs=dict(depth=1), show_progress=False, threads='auto', cbs=[Seen()])
    assert seen[:4] == [4, 2, 4, 1]                                           # the first epoch keeps the start's choice
    seen.clear(); torch.set_num_threads(3)
    L.train('ape', small, epochs=2, bs=64, model_kwargs=dict(depth=1), show_progress=False, threads=2, cbs=[Seen()])
    assert seen[:2] == [2, 2]                                                 # a number is kept
