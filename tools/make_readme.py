"""Write README.md from nbs/index.ipynb (the landing page), as nbdev_readme does but without Quarto.

    python tools/make_readme.py            # rewrite README.md
    python tools/make_readme.py --check    # exit 1 when README.md is out of step with the notebook
"""
import json, re, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

def readme_text(nb_path: Path = ROOT / 'nbs' / 'index.ipynb') -> str:
    "README markdown: the notebook's markdown cells and its shown code cells, with links made relative to the root."
    out = []
    for c in json.loads(nb_path.read_text())['cells']:
        src = ''.join(c['source']).strip('\n')
        if c['cell_type'] == 'markdown':
            src = re.sub(r'^> ', '', src, flags=re.M)                                  # the page's tagline
            src = re.sub(r'\]\((?!https?:|#)([^)]+)\)', r'](nbs/\1)', src)              # notebook-relative links
            out.append(src)
        elif c['cell_type'] == 'code' and not src.startswith('#|'):
            out.append(f"```python\n{src}\n```")
    return '\n\n'.join(out) + '\n'

if __name__ == '__main__':
    text, dest = readme_text(), ROOT / 'README.md'
    if '--check' in sys.argv:
        ok = dest.read_text() == text
        print('README.md is in step with nbs/index.ipynb' if ok else 'README.md differs from nbs/index.ipynb: run python tools/make_readme.py')
        sys.exit(0 if ok else 1)
    dest.write_text(text); print(f"wrote {dest.relative_to(ROOT)}")
