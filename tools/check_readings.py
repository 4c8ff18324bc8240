"""List the figures a page's prose states that the page does not show: every decimal (`.845`, `−.013`, `0.73`), every
percentage (`48 %`) and every time (`142 s`, `4.7 min`) in a notebook's markdown cells must appear, at the precision
the prose gives it, among

- the page's own saved outputs (printed text, tables, markdown built from the values),
- the committed results the page reads (`nbs/results/<name>/`, CSV and JSON values, as fractions or percentages): a
  page reads `<name>` when its cells name `results/<name>`, `images/<name>_...` or the string `'<name>'`,
- the numbers its code cells set (settings such as `alpha=.5` or `bs=180` are not readings),
- and, in a paragraph or table that names the paper ("paper", "published", "Table N", "Fig."), the paper's published
  figures as `pe_anchors.paper` holds them (`PAPER_FIGURES` below: the values of its constants, never typed here).

What is not a reading is skipped: LaTeX, code spans, links, HTML; integers without a unit (years, epochs, image sizes,
counts such as "8 draws"); versions (`2.4.14`); numbers glued to letters (`ViT-S/16`, `1e-3`, `x2`); numbers after `=`
or a hyperparameter's symbol (α = .4, σ 2.5).

    python tools/check_readings.py                     # every notebook in nbs/
    python tools/check_readings.py nbs/11_mech.sae.ipynb
"""
from __future__ import annotations
import csv, json, math, re, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NBS, RESULTS = ROOT / 'nbs', ROOT / 'nbs' / 'results'

def paper_figures() -> list[float]:
    "Every number in the constants of `pe_anchors.paper` (the published figures the pages may quote)."
    from pe_anchors import paper
    out = []
    def walk(v):
        if isinstance(v, bool): return
        if isinstance(v, (int, float)): out.append(float(v))
        elif isinstance(v, dict): [walk(x) for x in v.values()]
        elif isinstance(v, (list, tuple)): [walk(x) for x in v]
    for name in dir(paper):
        if name.startswith('PAPER_'): walk(getattr(paper, name))
    return out

# A number not glued to a word, a dot, a slash or a section sign; an optional sign (a minus, or a hyphen after a space
# or a bracket); an optional percent sign or time unit.
FIGURE = re.compile(r'(?:(?<=[\s(\[|,;:])|^)(?P<sign>[−-])?(?P<num>\d*\.?\d+(?:\.\d+)*)(?P<unit>\s?%|\s(?:s|min|h)\b)?'
                    r'(?![\w.]*\d)(?![\w/])', re.M)
SETTING = re.compile(r'(?:=|≤|≥|<|>|α|σ|quality|alpha|sigma|lr|×|arXiv)\s*$')
LEVEL = re.compile(r'^\s*(?:%\s*)?(?:CI|interval|confidence)')                  # "95% interval": a setting
PERCENT = re.compile(r'([−-]?\d+(?:\.\d+)?)\s?%')
NUMBER = re.compile(r'[−-]?(?:\d+\.?\d*|\.\d+)(?:[eE][−+-]?\d+)?')
PAPER_WORDS = re.compile(r'paper|published|Mannes|Table\s?\d|Fig(?:ure|\.)\s?\d', re.I)

def strip_markup(md: str) -> str:
    "Markdown without what carries no reading: LaTeX, code, links' targets, HTML tags and comments."
    for pat in (r'\$\$.*?\$\$', r'```.*?```', r'<!--.*?-->'): md = re.sub(pat, ' ', md, flags=re.S)
    for pat in (r'\$[^$\n]*\$', r'`[^`\n]*`', r'\]\([^)\s]*\)', r'<[^>\n]+>'): md = re.sub(pat, ' ', md)
    return md

def prose_figures(md: str) -> list[dict]:
    "The figures of one markdown text: value, decimals, kind ('fraction', 'percent', 'time') and the text around."
    out, text = [], strip_markup(md)
    for m in FIGURE.finditer(text):
        num, unit = m['num'], (m['unit'] or '').strip()
        if num.count('.') > 1 or (('.' not in num) and not unit): continue
        if SETTING.search(text[max(0, m.start() - 12):m.start()]) or LEVEL.match(text[m.end():m.end() + 12]): continue
        v = float(num) * (-1 if m['sign'] else 1)
        dec = len(num.split('.')[1]) if '.' in num else 0
        kind = 'percent' if unit == '%' else 'time' if unit else 'fraction'
        out.append(dict(text=m.group(0).strip(), value=v, decimals=dec, kind=kind,
                        context=text[max(0, m.start() - 50):m.end() + 30].replace('\n', ' ')))
    return out

def numbers(text: str) -> list[float]:
    "Every number printed in a text (a unicode minus counts as a sign)."
    out = []
    for s in NUMBER.findall(text.replace('−', '-')):
        try: out.append(float(s))
        except ValueError: pass
    return out

def output_text(nb: dict) -> str:
    "Everything a page prints: streams, plain text, markdown and HTML outputs (tags dropped: a wide table's HTML is whole)."
    out = []
    for c in nb['cells']:
        for o in c.get('outputs', []):
            if 'text' in o: out.append(''.join(o['text']))
            d = o.get('data', {})
            for k in ('text/plain', 'text/markdown'):
                if k in d: out.append(''.join(d[k]))
            if 'text/html' in d: out.append(re.sub(r'<style.*?</style>|<[^>]+>', ' ', ''.join(d['text/html']), flags=re.S))
    return '\n'.join(out)

def result_values(path: Path) -> list[float]:
    "The numbers of a committed results file (CSV cells, JSON values)."
    if path.suffix == '.csv':
        with path.open() as f: return [x for row in csv.reader(f) for cell in row for x in numbers(cell)
                                       if re.fullmatch(r'\s*[-+]?[\d.eE+-]+\s*', cell)]
    out = []
    def walk(v):
        if isinstance(v, bool): return
        if isinstance(v, (int, float)): out.append(float(v))
        elif isinstance(v, dict): [walk(x) for x in v.values()]
        elif isinstance(v, list): [walk(x) for x in v]
    walk(json.loads(path.read_text()))
    return out

def results_read(nb: dict) -> list[str]:
    "The committed experiments a page reads: those whose name its cells give as `results/<name>`, `images/<name>_` or a string."
    src = '\n'.join(''.join(c['source']) for c in nb['cells'])
    names = [d.name for d in RESULTS.iterdir() if d.is_dir()] if RESULTS.exists() else []
    return sorted(n for n in names if re.search(rf"(?:results/|images/|['\"]){re.escape(n)}(?=[/_'\"])", src))

def matches(fig: dict, shown: list[float], percents: list[float] = (), settings: list[float] = ()) -> bool:
    """Whether a number the page shows rounds to the figure at the figure's own precision: a fraction among the shown
    numbers or the settings; a percentage as a fraction (48 % = .48), among the printed percentages or the settings as
    a fraction; a time in seconds, minutes or hours among the shown numbers only."""
    tol = .5 * 10 ** -fig['decimals'] * (1 + 1e-6) + 1e-12
    v, kind = fig['value'], fig['kind']
    close = lambda pool, t, e: any(abs(x - t) <= e for x in pool if math.isfinite(x))
    if kind == 'fraction': return close(shown, v, tol) or close(settings, v, tol)
    if kind == 'percent':
        return close(shown, v / 100, tol / 100) or close(percents, v, tol) or close(settings, v / 100, tol / 100)
    return any(close(shown, t, e) for t, e in ((v, tol), (v * 60, tol * 60), (v * 3600, tol * 3600)))

def unmatched(nb_path: Path) -> list[dict]:
    "The figures of a page's prose that neither its outputs, the results it reads, its settings nor the paper give."
    nb = json.loads(Path(nb_path).read_text())
    out = output_text(nb)
    shown, percents = numbers(out), [float(x.replace('−', '-')) for x in PERCENT.findall(out)]
    settings = numbers('\n'.join(''.join(c['source']) for c in nb['cells'] if c['cell_type'] == 'code'))
    for name in results_read(nb):
        for f in sorted((RESULTS / name).glob('*')):
            if f.suffix in ('.csv', '.json'): shown += result_values(f)
    paper, bad = None, []
    for c in nb['cells']:
        if c['cell_type'] != 'markdown': continue
        blocks = re.split(r'\n\s*\n', ''.join(c['source']))
        for i, block in enumerate(blocks):
            for fig in prose_figures(block):
                if matches(fig, shown, percents, settings): continue
                # the paper's figures, where the paragraph (or, for a table, the paragraph above it) names the paper
                if PAPER_WORDS.search(block) or (block.lstrip().startswith('|') and i and PAPER_WORDS.search(blocks[i - 1])):
                    paper = paper_figures() if paper is None else paper
                    if matches(fig, paper): continue
                bad.append(dict(page=Path(nb_path).name, **fig))
    return bad

if __name__ == '__main__':
    paths = [Path(a) for a in sys.argv[1:]] or sorted(NBS.glob('*.ipynb'))
    bad = [b for p in paths for b in unmatched(p)]
    for b in bad: print(f"{b['page']}: {b['text']!r} in ...{b['context']}...")
    print(f"{len(bad)} figure(s) in the prose that the pages do not show" if bad else "every figure in the prose is shown")
    sys.exit(1 if bad else 0)
