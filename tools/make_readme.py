"""Write README.md from nbs/index.ipynb (the landing page), as nbdev_readme does but without Quarto.

Links to other pages (`protocol.ipynb`, `20_reproduce.ipynb#cifar-10-on-a-cpu`, `pos_embed.html`) point to the
documentation site (`doc_host` + `doc_baseurl` of settings.ini), where the notebooks are rendered; other relative links
(images) point into the repository.

    python tools/make_readme.py            # rewrite README.md
    python tools/make_readme.py --check    # exit 1 when README.md is out of step with the notebook
"""
import configparser, json, re, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

def site_url() -> str:
    "The documentation site, from settings.ini (`doc_host` + `doc_baseurl`)."
    cfg = configparser.ConfigParser(); cfg.read(ROOT / 'settings.ini')
    return cfg['DEFAULT']['doc_host'].rstrip('/') + '/' + cfg['DEFAULT']['doc_baseurl'].strip('/')

def page_url(target: str, site: str) -> str:
    "A notebook's page on the site: nbdev drops the number prefix (`01_pos_embed.ipynb` -> `pos_embed.html`)."
    path, _, anchor = target.partition('#')
    stem = re.sub(r'^\d+[a-z]?_', '', Path(path).stem)
    url = f"{site}/" if stem == 'index' else f"{site}/{stem}.html"
    return url + (f"#{anchor}" if anchor else '')

def _link(m: re.Match, site: str) -> str:
    target = m.group(1)
    if re.match(r'^[\w.-]+\.(ipynb|html)(#.*)?$', target): return f"]({page_url(target, site)})"
    return f"](nbs/{target})"

def readme_text(nb_path: Path = ROOT / 'nbs' / 'index.ipynb') -> str:
    "README markdown: the notebook's markdown cells, its shown code cells and the markdown printed by its `echo: false` cells."
    out, site = [], site_url()
    for c in json.loads(nb_path.read_text())['cells']:
        src = ''.join(c['source']).strip('\n')
        if c['cell_type'] == 'markdown':
            src = re.sub(r'^> ', '', src, flags=re.M)                                  # the page's tagline
            src = re.sub(r'\]\((?!https?:|#)([^)]+)\)', lambda m: _link(m, site), src)
            out.append(src)
        elif c['cell_type'] == 'code' and not src.startswith('#|'):
            out.append(f"```python\n{src}\n```")
        elif c['cell_type'] == 'code' and re.search(r'^#\|\s*echo:\s*false', src, flags=re.M):   # a reading printed from values:
            for o in c.get('outputs', []):                                                     # its markdown output
                md = o.get('data', {}).get('text/markdown')
                if md: out.append(re.sub(r'\]\((?!https?:|#)([^)]+)\)', lambda m: _link(m, site), ''.join(md).strip('\n')))
    return '\n\n'.join(out) + '\n'

if __name__ == '__main__':
    text, dest = readme_text(), ROOT / 'README.md'
    if '--check' in sys.argv:
        ok = dest.read_text() == text
        print('README.md is in step with nbs/index.ipynb' if ok else 'README.md differs from nbs/index.ipynb: run python tools/make_readme.py')
        sys.exit(0 if ok else 1)
    dest.write_text(text); print(f"wrote {dest.relative_to(ROOT)}")
