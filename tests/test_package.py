"""The package as a whole: its version, its README in step with the home page, no reference outside the repository."""
import configparser, json, re, sys
from pathlib import Path

import pe_anchors

ROOT = Path(__file__).resolve().parents[1]


def test_version_matches_settings():
    cfg = configparser.ConfigParser(); cfg.read(ROOT / 'settings.ini')
    assert pe_anchors.__version__ == cfg['DEFAULT']['version']


def test_readme_mirrors_index_and_has_two_commands():
    readme = (ROOT / 'README.md').read_text()
    nb = json.loads((ROOT / 'nbs' / 'index.ipynb').read_text())
    md = '\n'.join(''.join(c['source']) for c in nb['cells'] if c['cell_type'] == 'markdown')
    for heading in re.findall(r'^##+ .*$', md, flags=re.M): assert heading in readme, heading
    sys.path.insert(0, str(ROOT / 'tools'))
    from make_readme import readme_text
    assert readme == readme_text(), "README.md is out of step with nbs/index.ipynb: run python tools/make_readme.py"
    cmds = re.findall(r'^python3 -m venv .*$', readme, flags=re.M)
    assert len(cmds) == 2 and cmds[0].endswith('pe_anchors demo') and 'pytest' in cmds[1]


def test_package_does_not_depend_on_shared():
    for f in (ROOT / 'pe_anchors').rglob('*.py'):
        assert 'shared/' not in f.read_text(), f
