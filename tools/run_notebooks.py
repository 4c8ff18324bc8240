"""Execute notebooks in place and save their outputs (the docs show them): `python tools/run_notebooks.py nbs/06_ssdc.ipynb ...`.

Cells flagged `#| cuda` run only where a GPU is present; `#| slow` cells run (they hold the worked examples' results)
unless `--no-slow` is given (for pages whose slow cells only repeat a run for the reader, as `20_reproduce`).
Each notebook runs in its own folder (as Jupyter and `nbdev_test` run it), so relative paths such as
`results/cifar10-cpu/results.csv` resolve the same way. Warnings that name machine paths (timm's torch.jit deprecation, timm's registry notice on re-registering) are filtered,
so no saved output carries them. Figures are saved as PNG at 100 dpi (a `PAGE_WIDTH` figure, 8 in, is 800 px: Quarto's page
column), without matplotlib's version stamp, so a re-run that changes no number leaves the page byte-identical. A cell ending in `;` keeps its printed text, as in Jupyter (execnb alone drops it), and a cell that now prints nothing
loses the outputs of its last run (execnb alone keeps them).

**What a page was computed from.** While a page runs, every file it opens under `nbs/results/` (the committed tables,
their `meta.json`, the per-run tables) is recorded, and the page's notebook metadata (`pe_anchors`, kept by
`nbdev_clean`: `allowed_metadata_keys` in settings.ini) gets the SHA-256 of each, the package version and a checksum
of the package's code. `tests/test_stale.py` fails when a recorded table differs from the file on disk, naming the page
and the table; `--stale` re-executes exactly the pages whose recorded tables (or package version) changed, and
`--stale-code` also those run with other code. Files a page reads through native code (a kept model's safetensors) are
not seen; the tables a page computes from are.

`--section "On CIFAR-10"` re-runs one section of a page: its import cells (the cells nbdev's docs build runs too; they
are cheap by the docs test's rule), every name of its module (`pe_anchors.<default_exp>`, private helpers included, for
the definitions a module's page makes in its own cells) and the cells from the `## On CIFAR-10...` heading to the next `##` heading; every
other cell keeps its saved outputs, and the page's record keeps the tables those read. For a section that reads
committed tables, when only those tables changed.
Run `nbdev_clean` afterwards; CI checks that it leaves no diff."""
import hashlib, json, os, re, sys, time
from pathlib import Path

os.environ.setdefault('MPLBACKEND', 'Agg')
os.environ['PYTHONWARNINGS'] = 'ignore::FutureWarning,ignore::DeprecationWarning'   # inherited by the kernel's imports

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / 'nbs' / 'results'
# Figures as the pages show them: PNG at 100 dpi, no 'Software' text chunk (execnb's default, 'retina', draws at twice the
# dpi); no figure left open in this process (the first cell would show it) is carried into the page
FIGURES = ("set_matplotlib_formats('png', metadata={'Software': None}); "
           "import matplotlib, matplotlib.pyplot as plt; matplotlib.rcParams['figure.dpi'] = 100; plt.close('all'); "
           "del matplotlib, plt")                          # the page imports its own names
KEY = 'pe_anchors'                  # the notebook metadata key of the record (settings.ini: allowed_metadata_keys)

def _keep_stdout_of_quiet_cells(CaptureShell):
    "execnb drops a cell's stdout when the cell ends in `;`; Jupyter only hides its value. Run `cell; pass` instead."
    run = CaptureShell._run
    def _run(self, raw_cell, *args, **kwargs):
        if raw_cell.rstrip().endswith(';'): raw_cell = raw_cell.rstrip() + '\npass'
        return run(self, raw_cell, *args, **kwargs)
    CaptureShell._run = _run

_IMPORT = re.compile(r'^\s*(from\s+\S+\s+)?import\s+', re.M)

def _in_section(cells, heading):
    "The ids of the cells from the markdown heading `## heading...` to the next `##` heading; one line if there is none."
    ids, inside = set(), False
    for i, c in enumerate(cells):
        if c.cell_type == 'markdown' and c.source.lstrip().startswith('## '):
            inside = c.source.lstrip()[3:].startswith(heading)
        if inside: ids.add(i)
    if not ids: sys.exit(f"no section '## {heading}' in the notebook")
    return ids

# ---------------------------------------------------------------------------------------------------------------------
# The record of what a page read

class _Opened:
    "The files opened under `root` while recording (a process-wide audit hook; one is installed, it cannot be removed)."
    root, files, on = RESULTS, set(), False
    installed = False

    @classmethod
    def start(cls, root: Path):
        if not cls.installed: sys.addaudithook(cls._hook); cls.installed = True
        cls.root, cls.files, cls.on = Path(root).resolve(), set(), True

    @classmethod
    def stop(cls) -> set:
        cls.on = False
        return cls.files

    @classmethod
    def _hook(cls, event, args):
        if not cls.on or event != 'open' or not args or not isinstance(args[0], (str, bytes, os.PathLike)): return
        try: p = Path(os.fsdecode(args[0]))
        except (TypeError, ValueError): return
        p = Path(os.path.abspath(p))
        if p.is_relative_to(cls.root): cls.files.add(p)

def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, 'rb') as f:
        for block in iter(lambda: f.read(1 << 20), b''): h.update(block)
    return h.hexdigest()

def package_record() -> dict:
    "The package version and a checksum of its code (every .py file of `pe_anchors/`, by path and content)."
    from importlib.metadata import version
    h = hashlib.sha256()
    for f in sorted((ROOT / 'pe_anchors').rglob('*.py')):
        h.update(str(f.relative_to(ROOT)).encode()); h.update(f.read_bytes())
    return {'version': version('pe_anchors'), 'code': h.hexdigest()[:16]}

def record(files, root: Path = RESULTS, previous: dict | None = None) -> dict:
    "The metadata record of a run: each file read (relative to `root`'s parent) with its SHA-256, and the package."
    base = Path(root).resolve().parent
    tables = dict((previous or {}).get('tables', {}))
    tables.update({str(Path(f).relative_to(base)): sha256(f) for f in sorted(files) if Path(f).is_file()})
    return {'tables': dict(sorted(tables.items())), 'package': package_record()}

def stale_inputs(nb_path, root: Path = RESULTS, code: bool = False) -> list[str]:
    """Why a page is stale: each recorded table missing or changed on disk, a different package version (and, with
    `code`, different package code); [] when it is current or carries no record."""
    rec = json.loads(Path(nb_path).read_text()).get('metadata', {}).get(KEY)
    if not rec: return []
    base, out = Path(root).resolve().parent, []
    for name, digest in rec.get('tables', {}).items():
        p = base / name
        if not p.is_file(): out.append(f"{name} (missing)")
        elif sha256(p) != digest: out.append(f"{name} (changed)")
    now, then = package_record(), rec.get('package', {})
    if then.get('version') != now['version']: out.append(f"pe_anchors {then.get('version')} (now {now['version']})")
    if code and then.get('code') != now['code']: out.append("the package's code (changed)")
    return out

def stale_pages(nbs: Path = ROOT / 'nbs', code: bool = False) -> dict:
    "Page -> why it is stale, for every notebook of `nbs` whose record no longer matches."
    return {p: why for p in sorted(Path(nbs).glob('*.ipynb')) if (why := stale_inputs(p, code=code))}

# ---------------------------------------------------------------------------------------------------------------------

def main(paths, slow=True, section=None, results: Path = RESULTS):
    import torch
    from execnb.nbio import read_nb, write_nb
    from execnb.shell import CaptureShell
    _keep_stdout_of_quiet_cells(CaptureShell)
    cuda = torch.cuda.is_available()
    chosen = None
    def skip(cell):
        src = cell.source.lstrip()
        skipped = ((not cuda and src.startswith('#| cuda')) or (not slow and src.startswith('#| slow'))
                   or 'eval: false' in src.split('\n', 1)[0])
        if chosen is not None and not skipped:                # a section: its cells, and the import cells before it
            idx = cell.idx_
            skipped = not (idx in chosen or (idx < min(chosen) and _IMPORT.search(src) and 'nbdev_export' not in src))
        if not skipped and cell.cell_type == 'code': cell.outputs = []   # execnb keeps old outputs of a silent cell
        return skipped
    home = Path.cwd()
    for p in [Path(x).resolve() for x in paths]:
        t = time.perf_counter()
        nb = read_nb(p)
        if section: chosen = _in_section(nb.cells, section)
        exp = re.search(r'^#\|\s*default_exp\s+(\S+)', '\n'.join(c.source for c in nb.cells), re.M) if section else None
        os.chdir(p.parent)
        sh = CaptureShell(path=p.parent, mpl_format='png')
        sh.run(FIGURES)
        sh.run('import warnings; warnings.filterwarnings("ignore", category=FutureWarning); '
               'warnings.filterwarnings("ignore", category=DeprecationWarning); '
               'warnings.filterwarnings("ignore", message="Overwriting .* in registry")')
        if exp:   # the module's whole namespace, private helpers included, as the page's own definitions would leave it
            sh.run(f'import pe_anchors.{exp.group(1)} as _m; '
                   'globals().update({k: v for k, v in vars(_m).items() if not k.startswith("__")}); del _m')
        _Opened.start(results)
        try: sh.run_all(nb, exc_stop=True, preproc=skip)
        finally: os.chdir(home); read = _Opened.stop()
        nb.metadata[KEY] = record(read, results, nb.metadata.get(KEY) if section else None)
        write_nb(nb, p)
        print(f"{p.relative_to(home) if p.is_relative_to(home) else p}: {time.perf_counter() - t:.0f} s, "
              f"{len(nb.metadata[KEY]['tables'])} committed file(s) recorded", flush=True)

if __name__ == '__main__':
    args = sys.argv[1:]
    section = args.pop(args.index('--section') + 1) if '--section' in args else None
    if section: args.remove('--section')
    slow = '--no-slow' not in args
    if '--stale' in args or '--stale-code' in args:
        pages = stale_pages(code='--stale-code' in args)
        for p, why in pages.items(): print(f"{p.relative_to(ROOT)}: {'; '.join(why)}")
        if not pages: print("no page is stale")
        paths = [str(p) for p in pages]
    else: paths = [a for a in args if not a.startswith('--')]
    main(paths, slow=slow, section=section)
