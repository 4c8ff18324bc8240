"""pe_anchors.config: an experiment written down, checked field by field with typed errors, its presets."""
import pytest

import pe_anchors  # noqa: F401
from pe_anchors.config import Experiment, PRESETS, preset

from conftest import tiny, tiny_two_conditions


def test_experiment_file_round_trip_and_validation(tmp_path):
    exp = tiny_two_conditions(seeds=[0, 3])
    for name in ('e.json', 'e.yaml'):
        assert Experiment.load(exp.save(tmp_path / name)) == exp
    assert Experiment.load('digits') == preset('digits')
    with pytest.raises(ValueError, match="unknown condition 'cape'"): tiny_two_conditions(conditions=['cape'])
    with pytest.raises(ValueError, match='seeds must be'): tiny_two_conditions(seeds=[])
    with pytest.raises(ValueError, match="unknown RPI mode"): tiny_two_conditions(rpi_mode='pixel')
    with pytest.raises(FileNotFoundError): Experiment.load(tmp_path / 'missing.yaml')
    assert set(PRESETS) == {'digits', 'cifar10', 'cifar10-cpu', 'cifar10-cpu-dose', 'cifar10-cpu-deep', 'cifar10-cpu-factorial', 'imagenet100'}
    assert preset('imagenet100').model == 'pe_vit_small_patch16_224' and preset('imagenet100').seeds == [0, 1, 2, 3]


@pytest.mark.parametrize('fields, kind', [(dict(name=123), TypeError), (dict(untrained='false'), TypeError),
                                          (dict(seeds=[True]), TypeError), (dict(n_perms=2.0), TypeError),
                                          (dict(alphas=['1']), TypeError), (dict(n_perms=0), ValueError),
                                          (dict(seeds=[-1]), ValueError), (dict(data_kwargs=dict(name='x')), ValueError)])
def test_the_library_raises_typed_errors_with_the_same_message(fields, kind):
    from pe_anchors.experiment import ExperimentError
    with pytest.raises(ExperimentError) as e: tiny(**fields)
    assert isinstance(e.value, kind) and isinstance(e.value, ValueError) and str(next(iter(fields))) in str(e.value)


def test_a_data_kwargs_name_reaches_a_builder_that_takes_one(tmp_path):
    from PIL import Image
    from pe_anchors.data import get_data
    for split in ('train', 'val'):
        for c in ('a', 'b'):
            (tmp_path / split / c).mkdir(parents=True)
            Image.new('RGB', (8, 8), (10, 200, 30)).save(tmp_path / split / c / 'x.png')
    assert get_data(str(tmp_path), name='mine', img_size=8).name == 'mine'   # not "multiple values for argument 'name'"
    assert Experiment(data=str(tmp_path), data_kwargs=dict(name='mine', img_size=8)).data_kwargs['name'] == 'mine'
