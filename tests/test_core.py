"""pe_anchors.core: the conditions and their groups, grid coordinates, per-image randomness, the one permutation-seed
rule, full disks recognised whichever library wrote, and files written whole."""
import errno, re
from pathlib import Path

import pytest
import torch

from pe_anchors.core import (CONDITIONS, DOSE_CONDITIONS, EXTENSION_CONDITIONS, FACTORIAL, FACTORIAL_CONDITIONS, PADDING_MODES, PAPER_CONDITIONS, check_choice,
                             condition_label, condition_model_kwargs, condition_order, condition_spec, disk_error, grid_coords,
                             image_perms, read_json, run_perm_seed, write_atomic)
from pe_anchors.pos_embed import PE_NAMES

ROOT = Path(__file__).resolve().parents[1]


def test_every_condition_is_a_pe_with_a_label_in_one_group():
    groups = PAPER_CONDITIONS + EXTENSION_CONDITIONS + DOSE_CONDITIONS + tuple(c for c in FACTORIAL_CONDITIONS
                                                                                 if c not in DOSE_CONDITIONS)
    assert sorted(groups) == sorted(CONDITIONS) and len(set(groups)) == len(groups)           # each in exactly one group
    assert all(CONDITIONS[c]['pe'] in PE_NAMES for c in CONDITIONS)
    assert len({condition_label(c) for c in CONDITIONS}) == len(CONDITIONS)                    # labels tell them apart
    assert condition_order(['rope_mixed', 'nope', 'ape', 'rpt']) == ['ape', 'nope', 'rpt', 'rope_mixed']
    assert condition_model_kwargs('peg_circular')['pe_kwargs'] == dict(padding_mode='circular')
    assert condition_model_kwargs('peg_circular')['pe_kwargs']['padding_mode'] in PADDING_MODES
    with pytest.raises(ValueError, match="unknown condition 'cape'"): condition_spec('cape')
    for c, (f, s) in FACTORIAL.items():                 # each factorial cell builds the smooth table it names
        pk = {'table': 'smooth', 'shuffle': 0., 'scale': 1., **condition_model_kwargs(c)['pe_kwargs']}
        assert CONDITIONS[c]['pe'] == 'fixed' and (pk['table'], pk['shuffle'], pk['scale']) == ('smooth', f, s)
    assert len(FACTORIAL) == 9 and sorted(FACTORIAL) == sorted(FACTORIAL_CONDITIONS)
    with pytest.raises(ValueError, match="valid: 'a', 'b'"): check_choice('thing', 'c', ['a', 'b'])


def test_grid_coordinates_and_per_image_permutations():
    assert grid_coords((2, 3)).tolist() == [[0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [1, 2]]
    a, b = image_perms(3, 0, 4, 16), image_perms(3, 2, 2, 16)
    assert torch.equal(a[2:], b) and all(sorted(p.tolist()) == list(range(16)) for p in a)    # image i's, however batched


def test_one_permutation_seed_rule():
    "Run `seed`'s RPI draws start at `run_perm_seed(seed)`; no module or page writes the rule out again."
    seeds = [run_perm_seed(s) for s in range(5)]
    assert len(set(seeds)) == 5 and all(b - a >= 8 for a, b in zip(seeds, seeds[1:]))       # 8 draws never overlap
    rule = re.compile(r'\b1000\s*\*\s*(int\()?\s*\w*seed')
    files = [*(ROOT / 'pe_anchors').rglob('*.py'), *(ROOT / 'nbs').glob('*.ipynb'), *(ROOT / 'tests').glob('*.py')]
    hits = [str(f.relative_to(ROOT)) for f in files if f.name not in ('core.py', '00_core.ipynb', 'test_core.py')
            and rule.search(f.read_text())]
    assert not hits, hits


def test_a_full_disk_is_recognised_whichever_library_wrote(tmp_path):
    e = disk_error(OSError(errno.ENOSPC, 'No space left on device'), tmp_path / 'x')
    assert (e.errno, e.filename) == (errno.ENOSPC, str(tmp_path / 'x'))
    assert disk_error(RuntimeError('I/O error: No space left on device (os error 28)'), 'y').errno == errno.ENOSPC
    assert disk_error(OSError(errno.EROFS, 'Read-only file system', 'z'), 'y') is None        # names its file already
    assert disk_error(ValueError('something else'), 'y') is None


def test_files_are_written_whole_and_named_when_damaged(tmp_path):
    p = write_atomic(tmp_path / 'a.json', '{"x": 1}')
    assert read_json(p) == {'x': 1} and [f.name for f in tmp_path.iterdir()] == ['a.json']
    (tmp_path / 'b.json').write_text('{"x": ')
    with pytest.raises(ValueError, match='b.json is damaged'): read_json(tmp_path / 'b.json')
