"""The documentation site: nbdev's docs processing (everything `nbdev_docs` does short of calling Quarto) runs on the
notebooks in bounded time, executes no experiment, and every module page carries the API entries of its exports; the
processed pages render to HTML (nbconvert, standing in for Quarto, which these machines lack) with every figure, their
signatures carry no raw links and their links between pages land on existing headings; every figure a page's prose
states is shown by the page itself (tools/check_readings.py); the site is built and deployed by the GitHub workflows."""
import importlib, json, os, re, subprocess, sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NBS = ROOT / 'nbs'


@pytest.fixture(scope='module')
def processed(tmp_path_factory):
    # nbdev's processing into _proc/ (its own cache folder), in a fresh process: `proc_nbs` is the step of `nbdev_docs`
    # before Quarto (`nbdev_proc_nbs` would first try to download Quarto). The timeout guards against a notebook that
    # trains at docs time; it is not a speed target.
    # Under pytest-xdist each worker asks for it: the first builds it under a lock shared by the workers (their common
    # temporary folder), the others wait and read its outcome, so two processings never write _proc/ at once.
    from filelock import FileLock
    # The common folder of this session's workers (pytest-N/); without xdist the session's own folder, so that no later
    # session reads an old _proc/ (the parent of a lone session's folder is shared by every session)
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get('PYTEST_XDIST_WORKER') else base
    with FileLock(str(shared / 'proc_nbs.lock')):
        done = shared / 'proc_nbs.json'
        if not done.exists():
            code = "from nbdev.serve import proc_nbs; proc_nbs(n_workers=2, force=True)"
            r = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True, text=True, timeout=900)
            done.write_text(json.dumps(dict(rc=r.returncode, stderr=r.stderr)))
        r = json.loads(done.read_text())
    assert r['rc'] == 0, r['stderr'][-3000:]
    assert 'Found cells containing imports and other code' not in r['stderr'], r['stderr'][-3000:]
    return ROOT / '_proc'


def _outputs(nb: dict) -> str:
    out = []
    for c in nb['cells']:
        for o in c.get('outputs', []):
            for v in o.get('data', {}).values(): out.append(''.join(v) if isinstance(v, list) else str(v))
            if 'text' in o: out.append(''.join(o['text']))
    return '\n'.join(out)


def test_every_module_page_documents_its_exports(processed):
    for nb_path in sorted(NBS.glob('[0-9]*.ipynb')):
        nb = json.loads(nb_path.read_text())
        m = re.search(r'#\|\s*default_exp\s+(\S+)', '\n'.join(''.join(c['source']) for c in nb['cells']))
        if not m: continue
        mod = importlib.import_module(f'pe_anchors.{m.group(1)}')
        page = _outputs(json.loads((processed / nb_path.name).read_text()))
        documented = [n for n in mod.__all__ if callable(getattr(mod, n)) and not n.startswith('_')
                      and getattr(getattr(mod, n), '__module__', mod.__name__) == mod.__name__]   # names it defines (not re-exports)
        missing = [n for n in documented if f'### {n}' not in page]
        assert not missing, f"{nb_path.name}: no API entry for {missing}"


def test_no_references_outside_the_repository():
    for f in [*NBS.glob('*.ipynb'), *(ROOT / 'pe_anchors').rglob('*.py'), ROOT / 'README.md']:
        text = f.read_text()
        assert 'SPEC.md' not in text and '../shared' not in text, f


def test_saved_outputs_are_clean_and_present():
    for nb_path in sorted(NBS.glob('*.ipynb')):
        nb = json.loads(nb_path.read_text())
        text = json.dumps([c.get('outputs', []) for c in nb['cells']])
        assert '/tmp/' not in text and 'FutureWarning' not in text and 'site-packages' not in text, nb_path.name
        code = [c for c in nb['cells'] if c['cell_type'] == 'code']
        if nb_path.stem != 'protocol' and code:
            assert any(c.get('outputs') for c in code), f"{nb_path.name} shows no output"


# ---------------------------------------------------------------------------------------------------------------------
# Readings: every figure a page's prose states is shown by the page (tools/check_readings.py)

def _check_readings():
    spec = importlib.util.spec_from_file_location('check_readings', ROOT / 'tools' / 'check_readings.py')
    mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
    return mod


def _nb(markdown: str, outputs: str = '', code: str = '') -> dict:
    "A minimal notebook: one code cell printing `outputs`, one markdown cell of prose."
    cells = [dict(cell_type='code', source=code, outputs=[dict(output_type='stream', name='stdout', text=outputs)]),
             dict(cell_type='markdown', source=markdown)]
    return dict(cells=cells)


@pytest.mark.parametrize('prose, outputs, code, flagged', [
    # the two mech pages' mistakes: a probe figure and a share the output does not print
    ("The position probe falls from .845 to .073.", "intact 0.782  selected 0.050", "", ['.845', '.073']),
    ("Head 3 carries about half of the recovery (48%).", "share 1.017 0.802", "", ['48%']),
    ("RPI-SSDC rises from .025 to .119.", "ssdc 0.035 -0.019", "", ['.025', '.119']),
    ("SSDC under RPI −.013 at layer 0.", "ssdc 0.013", "", ['−.013']),        # the sign counts
    ("trained in 142 s", "trained in 207 s", "", ['142 s']),
    ("48 % of it", "", "x = torch.randn(48, 3)", ['48 %']),                 # an integer setting is no percentage
    # figures the outputs give, at the prose's precision, as fractions or percentages
    ("The probe falls from .78 to .050 (chance .016), top-1 0.822.", "0.7823 0.0501 0.016 0.822", "", []),
    ("keeps 41% of it, 10 % of the dictionary", "retention 0.412; ratio 0.1", "", []),
    ("trained in 3.5 min", "trained in 207 s", "", []),
    # not readings: integers, versions, LaTeX, code, settings, names glued to numbers
    ("In 2024, 8 draws of 20 epochs at 224 px; torch 2.14.1; $\\alpha = 0.5$; `lr=0.73`; α = .4, σ 2.5; ViT-S/16; "
     "lr 1e-3; a 95% interval", "", "", []),
    ("dropout 0.15, weight decay .07", "", "train(lr=2e-3, drop=.15)", ['.07']),  # a setting as written in the code
])
def test_reading_checker_flags_figures_the_page_does_not_show(tmp_path, prose, outputs, code, flagged):
    cr = _check_readings()
    p = tmp_path / 'page.ipynb'
    p.write_text(json.dumps(_nb(prose, outputs, code)))
    assert [b['text'] for b in cr.unmatched(p)] == flagged


def test_reading_checker_allows_paper_figures_only_where_the_paper_is_named(tmp_path):
    "The paper's figures come from pe_anchors.paper (not typed in the test) and count only in a paragraph naming it."
    from pe_anchors.paper import PAPER_TABLE5
    cr = _check_readings()
    acc = PAPER_TABLE5['ape'][0][0]
    assert acc in cr.paper_figures()
    p = tmp_path / 'page.ipynb'
    p.write_text(json.dumps(_nb(f"The paper's APE reaches {acc:.4f}.\n\nOurs reaches {acc:.4f}.")))
    assert [b['context'].strip().startswith('Ours') or 'Ours' in b['context'] for b in cr.unmatched(p)] == [True]
    # a table under a caption that names the paper
    p.write_text(json.dumps(_nb(f"Table 5 of the paper:\n\n| APE | {acc:.4f} |\n|---|---|")))
    assert cr.unmatched(p) == []


def test_reading_checker_reads_the_committed_results_a_page_names(tmp_path):
    cr = _check_readings()
    v = cr.result_values(NBS / 'results' / 'cifar10-cpu' / 'results.csv')[0:0]        # the file parses
    df = __import__('pandas').read_csv(NBS / 'results' / 'cifar10-cpu' / 'results.csv')
    acc = df[(df.condition == 'nope') & (df.metric == 'acc') & (df['shift'].isna() | (df['shift'] == 'clean'))].value.iloc[0]
    p = tmp_path / 'page.ipynb'
    prose = f"NoPE reaches {acc:.3f}."
    p.write_text(json.dumps(_nb(prose)))
    assert len(cr.unmatched(p)) == 1 and v == []                                    # the page reads no results
    p.write_text(json.dumps(_nb(prose, code="df = load_results('results/cifar10-cpu/results.csv')")))
    assert cr.unmatched(p) == []


def test_every_page_states_only_figures_it_shows():
    "A figure in a page's prose (.845, −.013, 48 %, 142 s) must appear in its outputs or in the committed results it reads."
    cr = _check_readings()
    bad = [b for p in sorted(NBS.glob('*.ipynb')) for b in cr.unmatched(p)]
    assert not bad, "figures stated in prose that the page does not show (print them from the values, or drop them):\n" + \
        '\n'.join(f"  {b['page']}: {b['text']!r} in ...{b['context']}..." for b in bad)


# ---------------------------------------------------------------------------------------------------------------------
# What a reader sees of the processed pages

def _page_name(nb_path: Path) -> str:
    "The page nbdev/Quarto make of a notebook: the number prefix dropped (`11_mech.sae` -> `mech.sae`)."
    return re.sub(r'^\d+[a-z]?_', '', nb_path.stem)


def _markdown_texts(nb: dict):
    "(kind, text) of every markdown cell and every markdown output of a notebook."
    for c in nb['cells']:
        src = ''.join(c['source']) if isinstance(c['source'], list) else c['source']
        if c['cell_type'] == 'markdown': yield 'cell', src
        for o in c.get('outputs', []):
            md = o.get('data', {}).get('text/markdown')
            if md: yield 'output', ''.join(md) if isinstance(md, list) else md


def test_no_raw_links_in_rendered_signatures(processed):
    "Docments comments are printed verbatim inside the signature block: a backticked name there becomes a raw link."
    bad = []
    for p in sorted(processed.glob('*.ipynb')):
        for kind, text in _markdown_texts(json.loads(p.read_text())):
            if kind != 'output': continue
            for block in re.findall(r'```python\n(.*?)```', text, flags=re.S):
                bad += [f"{p.name}: {ln.strip()[:120]}" for ln in block.splitlines() if re.search(r'\[[^\]]*\]\([^)]*\)', ln)]
    assert not bad, "raw markdown links in signatures (drop the backticks in these docments):\n" + '\n'.join(bad)


def _slug(heading: str) -> str:
    "Pandoc's automatic identifier of a heading (what Quarto links to)."
    t = re.sub(r'\{[^}]*\}\s*$', '', heading)
    t = re.sub(r'\[([^\]]*)\]\([^)]*\)', r'\1', t).replace('`', '').replace('*', '')
    t = ''.join(ch for ch in t if ch.isalnum() or ch in '_-. \t').strip().lower()
    t = re.sub(r'\s+', '-', t)
    return re.sub(r'^[^a-z]+', '', t)


def _anchors(nb: dict) -> set:
    out = set()
    for _, text in _markdown_texts(nb):
        for h in re.findall(r'^#{1,6}\s+(.+?)\s*$', text, flags=re.M):
            out.add(_slug(h))
            out.update(re.findall(r'\{#([\w.-]+)', h))
        out.update(re.findall(r'\[[^\]]*\]\{#([\w.-]+)', text))
    return out


def test_links_between_pages_point_to_existing_anchors(processed):
    "Every link from one page to another (nbdev's API links included) lands on a page and a heading that exist."
    site = 'https://pe-anchors.github.io/pe_anchors/'
    pages = {_page_name(p): json.loads(p.read_text()) for p in processed.glob('*.ipynb')}
    anchors = {name: _anchors(nb) for name, nb in pages.items()}
    bad = []
    for name, nb in sorted(pages.items()):
        for _, text in _markdown_texts(nb):
            for target in re.findall(r'\]\(([^)\s]+)\)', text):
                if target.startswith(site): target = target[len(site):]
                elif re.match(r'^[a-z]+:', target) or target.startswith('#') or '/' in target: continue
                m = re.match(r'^([\w.-]+?)\.(?:html|ipynb)(?:#([^)]*))?$', target)
                if not m: continue
                page, anchor = re.sub(r'^\d+[a-z]?_', '', m.group(1)), m.group(2)
                if page not in pages: bad.append(f"{name}: {target} (no such page)")
                elif anchor and anchor not in anchors[page]: bad.append(f"{name}: {target} (no such heading on {page})")
    assert not bad, "broken links between pages:\n" + '\n'.join(sorted(set(bad)))


def test_every_page_is_in_the_navigation_and_the_landing_page_links_the_results():
    "Each notebook is a page of the site's sidebar (the navigation); the front page links every results page and the protocol."
    import yaml
    listed = set(re.findall(r'[\w.-]+\.ipynb', json.dumps(yaml.safe_load((NBS / 'sidebar.yml').read_text()))))
    missing = [p.name for p in sorted(NBS.glob('*.ipynb')) if p.stem != 'index' and p.name not in listed]
    assert not missing, f"not in nbs/sidebar.yml: {missing}"
    text = '\n'.join(t for _, t in _markdown_texts(json.loads((NBS / 'index.ipynb').read_text())))
    results = [p.name for p in sorted(NBS.glob('2*.ipynb'))] + ['protocol.ipynb']
    unlinked = [n for n in results if f"]({n}" not in text]
    assert not unlinked, f"the front page does not link: {unlinked}"


def test_no_progress_bars_in_saved_outputs():
    "A progress bar saved as output reads as noise on the page: examples run with show_progress=False / no_bar()."
    bad = []
    for p in sorted(NBS.glob('*.ipynb')):
        for i, c in enumerate(json.loads(p.read_text())['cells']):
            text = json.dumps(c.get('outputs', []), ensure_ascii=False)
            if '█' in text or '<progress' in text: bad.append(f"{p.name} cell {i}")
    assert not bad, f"progress bars stored as output: {bad}"


def test_processed_pages_render_to_html_with_every_figure(processed):
    "Each processed page renders to HTML with nbconvert (Quarto's stand-in here), and every figure it holds is in the HTML."
    nbconvert = pytest.importorskip('nbconvert')
    import nbformat
    exporter = nbconvert.HTMLExporter(template_name='basic')
    bad = []
    for p in sorted(processed.glob('*.ipynb')):
        nb = nbformat.reads(p.read_text(), as_version=4)
        images = sum(1 for c in nb.cells for o in c.get('outputs', [])
                     if any(k in o.get('data', {}) for k in ('image/png', 'image/jpeg')))
        svgs = sum(1 for c in nb.cells for o in c.get('outputs', []) if 'image/svg+xml' in o.get('data', {})
                   and not any(k in o['data'] for k in ('image/png', 'image/jpeg')))
        html, _ = exporter.from_notebook_node(nb)
        shown = len(re.findall(r'<img\s[^>]*src="data:image/(?:png|jpeg);base64,', html))
        if shown != images or html.count('<svg') < svgs: bad.append(f"{p.name}: {images} images, {shown} <img> in the HTML")
    assert not bad, '\n'.join(bad)


def test_site_is_built_and_deployed_by_ci():
    "nbdev's standard workflows: CI tests the notebooks, a push to main builds the Quarto site and deploys it to Pages."
    import configparser, yaml
    wf = ROOT / '.github' / 'workflows'
    test, deploy = (yaml.safe_load((wf / f).read_text()) for f in ('test.yaml', 'deploy.yaml'))
    on = lambda w: w.get('on', w.get(True))                                        # YAML 1.1 reads `on` as True
    uses = lambda w: [s.get('uses', '') for j in w['jobs'].values() for s in j['steps']]
    assert any(u.startswith('fastai/workflows/nbdev-ci@') for u in uses(test)) and 'pull_request' in on(test)
    assert any(u.startswith('fastai/workflows/quarto-ghp@') for u in uses(deploy))
    assert 'main' in on(deploy)['push']['branches'] and deploy['permissions'] == {'contents': 'write', 'pages': 'write'}
    cfg = configparser.ConfigParser(); cfg.read(ROOT / 'settings.ini')
    site = cfg['DEFAULT']['doc_host'].rstrip('/') + '/' + cfg['DEFAULT']['doc_baseurl'].strip('/')
    assert site == 'https://pe-anchors.github.io/pe_anchors'
    assert yaml.safe_load((NBS / 'nbdev.yml').read_text())['website']['site-url'] == site
    assert site in (ROOT / 'README.md').read_text(), "README.md does not link the documentation site"


# ---------------------------------------------------------------------------------------------------------------------
# No junk: signatures, saved outputs, references

_JUNK_SIGNATURE = ('NoneType=None', '=<factory>', ':function=', '=<lambda>')


def test_signatures_carry_no_junk(processed):
    "show_doc entries without `NoneType=None` (an unannotated None default), `=<factory>`, or a lambda default."
    bad = []
    for p in sorted(processed.glob('*.ipynb')):
        for kind, text in _markdown_texts(json.loads(p.read_text())):
            if kind != 'output': continue
            for block in re.findall(r'```python\n(.*?)```', text, flags=re.S):
                name = block.split('(')[0].split()[-1] if '(' in block else block[:40]
                bad += [f"{p.name}: {name}: {j}" for j in _JUNK_SIGNATURE if j in block]
    assert not bad, "signatures with junk (annotate the argument, or give a plain default):\n" + '\n'.join(sorted(set(bad)))


_JUNK_OUTPUT = {'a stderr stream': None, 'np.int64(': 'np.int64(', 'np.float64(': 'np.float64(', "'p = <'": 'p = <',
                "a hint for developers ('give ref_sd')": 'give ref_sd', 'a Warning': 'Warning:'}


def test_saved_outputs_carry_no_junk():
    "No warnings or stderr, no numpy reprs or 'p = < .001', no developer hints, no 'nan' cell in a printed table."
    bad = []
    for p in sorted(NBS.glob('*.ipynb')):
        for i, c in enumerate(json.loads(p.read_text())['cells']):
            for o in c.get('outputs', []):
                if o.get('output_type') == 'stream' and o.get('name') == 'stderr':
                    bad.append(f"{p.name} cell {i}: a stderr stream"); continue
                texts = [''.join(o['text'])] if 'text' in o else []
                texts += [''.join(v) if isinstance(v, list) else v for k, v in o.get('data', {}).items()
                          if k in ('text/plain', 'text/markdown')]
                for t in texts:
                    bad += [f"{p.name} cell {i}: {what}" for what, s in _JUNK_OUTPUT.items() if s and s in t]
                md = ''.join(o.get('data', {}).get('text/markdown', ''))
                if re.search(r'\|\s*(nan|NaN)\s*\|', md): bad.append(f"{p.name} cell {i}: 'nan' in a markdown table")
    assert not bad, "junk in saved outputs:\n" + '\n'.join(sorted(set(bad)))


def test_references_to_the_package_are_links():
    "nbdev links a backticked name it knows (`compare`, `pe_anchors.stats.compare`), not `stats.compare`: write one of those."
    from nbdev.doclinks import NbdevLookup
    lookup = NbdevLookup()
    mods = {p.stem for p in (ROOT / 'pe_anchors').rglob('*.py')} | {'callback', 'mech'}
    bad = []
    for p in sorted(NBS.glob('*.ipynb')):
        for c in json.loads(p.read_text())['cells']:
            src = ''.join(c['source'])
            if c['cell_type'] != 'markdown' and not src.startswith('#| export'): continue
            for tok in re.findall(r'`([A-Za-z_][\w.]*)(?:\(\))?`', src):
                if tok.split('.')[-1].startswith('_'): continue              # a private name has no heading to link to
                if '.' in tok and tok.split('.')[0] in mods and lookup.doc(tok) is None and lookup.doc(f'pe_anchors.{tok}'):
                    bad.append(f"{p.name}: `{tok}`")
    assert not bad, ("references nbdev does not link (python tools/link_names.py PAGE writes the short name, or "
                     "pe_anchors.<module>.<name>):\n" + "\n".join(bad))
