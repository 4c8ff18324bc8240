"""Make backticked references to the package links: nbdev links `compare` and `pe_anchors.stats.compare`, not
`stats.compare` (a `module.name` it cannot resolve stays plain text). In the markdown cells and the exported code's
docstrings of the given notebooks, each `module.name` nbdev does not resolve is rewritten as the short name when that
resolves to the same page and entry, else as `pe_anchors.module.name`.

    python tools/link_names.py nbs/10d_tables.ipynb ...     # rewrite in place, printing each change
    python tools/link_names.py --check nbs/*.ipynb          # exit 1 when some reference would change

In code, lines with a comment are left alone: a link in a docments comment is printed raw in the signature.
"""
import json, re, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOKEN = re.compile(r'`([A-Za-z_][\w.]*)(\(\))?`')

def rewrite(src: str, lookup, modules: set, changes: list) -> str:
    "`src` with its unresolved `module.name` references made resolvable (each change appended to `changes`)."
    def one(m):
        tok, paren = m.group(1), m.group(2) or ''
        if '.' not in tok or tok.split('.')[0] not in modules or lookup.doc(tok) is not None: return m.group(0)
        if tok.split('.')[-1].startswith('_'): return m.group(0)       # a private name: no heading to link to, left plain
        full = lookup.doc(f'pe_anchors.{tok}')
        if full is None: return m.group(0)
        short = tok.split('.')[-1]
        new = short if lookup.doc(short) == full else f'pe_anchors.{tok}'
        changes.append(f"{tok} -> {new}")
        return f'`{new}{paren}`'
    if not src.startswith('#| export'): return TOKEN.sub(one, src)
    # code: only lines without a comment, so a docments comment (printed raw in the signature) is never touched
    return ''.join(line if '#' in line else TOKEN.sub(one, line) for line in src.splitlines(keepends=True))

def main(paths, check=False) -> int:
    from nbdev.doclinks import NbdevLookup
    lookup = NbdevLookup()
    modules = {p.stem for p in (ROOT / 'pe_anchors').rglob('*.py')} | {'callback', 'mech'}
    changed = 0
    for p in map(Path, paths):
        nb, changes = json.loads(p.read_text()), []
        for c in nb['cells']:
            src = ''.join(c['source'])
            if c['cell_type'] != 'markdown' and not src.startswith('#| export'): continue
            new = rewrite(src, lookup, modules, changes)
            if new != src: c['source'] = new.splitlines(keepends=True)
        if changes:
            changed += 1
            print(f"{p}: " + '; '.join(changes))
            if not check: p.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + '\n')
    return 1 if check and changed else 0

if __name__ == '__main__':
    args = sys.argv[1:]
    sys.exit(main([a for a in args if a != '--check'], check='--check' in args))
