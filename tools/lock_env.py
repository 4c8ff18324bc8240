"""Regenerate `constraints.txt`: the complete lock of the environment CI tests, every package `pip install -e ".[dev]"`
pulls in pinned to the version installed, so that both README commands install without pip backtracking.

    python tools/lock_env.py            # run from the repository root, with the network to the package index

It makes a fresh virtual environment in a temporary folder, installs this repository there as the README's test command
does (`pip install -e ".[dev]" -c constraints.txt`: the versions CI tests today, whatever they pull), and writes what
pip installed (`pip freeze --all`, this package and pip itself left out) back to `constraints.txt`, with this header.
To move to newer versions, change a pin (torch, fastai, timm, ...) in `constraints.txt`, or delete the file's pins of
the packages to let float, and run it again. `settings.ini` keeps the ranges users install from."""
import argparse, subprocess, sys, tempfile, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEADER = """\
# The complete lock of the environment CI tests: every package `pip install -e ".[dev]"` pulls in, pinned (pip then installs
# without backtracking). Regenerate it with `python tools/lock_env.py`; settings.ini keeps the ranges users install from.
"""


def lock(python: str = sys.executable, constraints: Path = ROOT / 'constraints.txt') -> list[str]:
    "Install the repository with its dev extra in a fresh venv under `constraints`; return the pins of what it holds."
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([python, '-m', 'venv', d], check=True)
        pip = [str(Path(d) / 'bin' / 'python'), '-m', 'pip']
        t = time.perf_counter()
        subprocess.run([*pip, 'install', '-q', '-e', '.[dev]', '-c', str(constraints)], cwd=ROOT, check=True)
        print(f"installed in {time.perf_counter() - t:.0f} s", file=sys.stderr)
        out = subprocess.run([*pip, 'freeze', '--all', '--exclude-editable'], capture_output=True, text=True, check=True).stdout
    return sorted((l for l in out.splitlines() if '==' in l and l.split('==')[0].lower() not in ('pip', 'pe-anchors', 'pe_anchors')),
                  key=str.lower)


if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--python', default=sys.executable, help='the interpreter of the environment (default: this one)')
    a = p.parse_args()
    pins = lock(a.python)
    (ROOT / 'constraints.txt').write_text(HEADER + '\n'.join(pins) + '\n')
    print(f"constraints.txt: {len(pins)} packages pinned")
