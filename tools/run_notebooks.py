"""Execute notebooks in place and save their outputs (the docs show them): `python tools/run_notebooks.py nbs/06_ssdc.ipynb ...`.

Cells flagged `#| cuda` run only where a GPU is present; `#| slow` cells run (they hold the worked examples' results)
unless `--no-slow` is given (for pages whose slow cells only repeat a run for the reader, as `20_reproduce`).
Warnings that name machine paths (timm's torch.jit deprecation, timm's registry notice on re-registering) are filtered,
so no saved output carries them. Run `nbdev_clean` afterwards; CI checks that it leaves no diff."""
import os, sys, time, warnings
from pathlib import Path

os.environ.setdefault('MPLBACKEND', 'Agg')
os.environ['PYTHONWARNINGS'] = 'ignore::FutureWarning,ignore::DeprecationWarning'   # inherited by the kernel's imports

def main(paths, slow=True):
    import torch
    from execnb.nbio import read_nb, write_nb
    from execnb.shell import CaptureShell
    cuda = torch.cuda.is_available()
    def skip(cell):
        src = cell.source.lstrip()
        return ((not cuda and src.startswith('#| cuda')) or (not slow and src.startswith('#| slow'))
                or 'eval: false' in src.split('\n', 1)[0])
    for p in map(Path, paths):
        t = time.perf_counter()
        nb = read_nb(p)
        sh = CaptureShell(path=p.parent.resolve())
        sh.run('import warnings; warnings.filterwarnings("ignore", category=FutureWarning); '
               'warnings.filterwarnings("ignore", category=DeprecationWarning); '
               'warnings.filterwarnings("ignore", message="Overwriting .* in registry")')
        sh.run_all(nb, exc_stop=True, preproc=skip)
        write_nb(nb, p)
        print(f"{p}: {time.perf_counter() - t:.0f} s", flush=True)

if __name__ == '__main__': main([a for a in sys.argv[1:] if a != '--no-slow'], slow='--no-slow' not in sys.argv)
