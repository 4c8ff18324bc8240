"""Execute notebooks in place and save their outputs (the docs show them): `python tools/run_notebooks.py nbs/06_ssdc.ipynb ...`.

Cells flagged `#| cuda` run only where a GPU is present; `#| slow` cells run (they hold the worked examples' results)
unless `--no-slow` is given (for pages whose slow cells only repeat a run for the reader, as `20_reproduce`).
Each notebook runs in its own folder (as Jupyter and `nbdev_test` run it), so relative paths such as
`results/cifar10-cpu/results.csv` resolve the same way. Warnings that name machine paths (timm's torch.jit deprecation, timm's registry notice on re-registering) are filtered,
so no saved output carries them. A cell ending in `;` keeps its printed text, as in Jupyter (execnb alone drops it), and a cell that now prints nothing
loses the outputs of its last run (execnb alone keeps them).

`--section "On CIFAR-10"` re-runs one section of a page: its import cells (the cells nbdev's docs build runs too; they
are cheap by the docs test's rule), every name of its module (`pe_anchors.<default_exp>`, private helpers included, for
the definitions a module's page makes in its own cells) and the cells from the `## On CIFAR-10...` heading to the next `##` heading; every
other cell keeps its saved outputs. For a section that reads committed tables, when only those tables changed.
Run `nbdev_clean` afterwards; CI checks that it leaves no diff."""
import os, re, sys, time, warnings
from pathlib import Path

os.environ.setdefault('MPLBACKEND', 'Agg')
os.environ['PYTHONWARNINGS'] = 'ignore::FutureWarning,ignore::DeprecationWarning'   # inherited by the kernel's imports

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

def main(paths, slow=True, section=None):
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
        sh = CaptureShell(path=p.parent)
        sh.run('import warnings; warnings.filterwarnings("ignore", category=FutureWarning); '
               'warnings.filterwarnings("ignore", category=DeprecationWarning); '
               'warnings.filterwarnings("ignore", message="Overwriting .* in registry")')
        if exp:   # the module's whole namespace, private helpers included, as the page's own definitions would leave it
            sh.run(f'import pe_anchors.{exp.group(1)} as _m; '
                   'globals().update({k: v for k, v in vars(_m).items() if not k.startswith("__")}); del _m')
        try: sh.run_all(nb, exc_stop=True, preproc=skip)
        finally: os.chdir(home)
        write_nb(nb, p)
        print(f"{p.relative_to(home) if p.is_relative_to(home) else p}: {time.perf_counter() - t:.0f} s", flush=True)

if __name__ == '__main__':
    args = sys.argv[1:]
    section = args.pop(args.index('--section') + 1) if '--section' in args else None
    if section: args.remove('--section')
    main([a for a in args if a != '--no-slow'], slow='--no-slow' not in args, section=section)
