"""pe_anchors.experiment: the one import for the experiment's four parts (config, evaluate, sweep, kept), each name the
object its own module defines."""
import importlib

import pe_anchors.experiment as experiment


def test_the_experiment_module_holds_every_part_name():
    for part in ('config', 'evaluate', 'sweep', 'kept'):
        mod = importlib.import_module(f'pe_anchors.{part}')
        for name in mod.__all__:
            assert name in experiment.__all__ and getattr(experiment, name) is getattr(mod, name), (part, name)
    assert set(experiment.__all__) <= set(dir(experiment))
