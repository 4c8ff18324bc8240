"""A study never outlives its models: an experiment restarted with other settings is studied again (each record names
the model it measured, the rows are a fresh study's, the call says which runs), and a kill between a study's table and
its checksum is repaired by the next call."""
import json

import pandas as pd

from pe_anchors.results import read_table
from pe_anchors.rundir import StudyDir, checksum_file, hub_files
from pe_anchors.shift_study import resolution_study
from pe_anchors.study import file_sha256
from pe_anchors.sweep import run_experiment

from conftest import tiny


def test_a_restarted_experiment_is_studied_again_not_reused(tmp_path, capsys):
    E = tmp_path / 'exp'
    study = lambda out=None: resolution_study(E, sizes=(16, 24), ssdc=False, out=out, show_progress=False)
    run_experiment(tiny(), E, device='cpu', show=False)
    old = study()
    table = StudyDir(E, 'resolution').table('resolution')
    checksum_file(table).write_text(json.dumps(dict(sha256='0' * 64, rows=len(old))))   # killed before its checksum
    pd.testing.assert_frame_equal(study(), old)                                  # the next call: the same rows, rewritten
    pd.testing.assert_frame_equal(read_table(table), old, check_dtype=False)     # whole again
    capsys.readouterr()
    run_experiment(tiny(train_kwargs=dict(epochs=2)), E, restart=True, device='cpu', show=False)   # other settings
    new = study()
    assert 'measured again, the model changed since: ape-s0, nope-s0' in capsys.readouterr().out
    for c in ('ape', 'nope'):                                                      # each record names the new model
        rec = json.loads(StudyDir(E, 'resolution').record(c, 0).read_text())
        assert rec['model'] == file_sha256(hub_files(E / 'runs' / f'{c}-s0' / 'model')[1]), c
    pd.testing.assert_frame_equal(new, study(out=tmp_path / 'fresh'))             # a fresh study of the new models
    assert not new['value'].equals(old['value'])                                 # not the old models' values
