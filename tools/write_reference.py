"""Write the package's reference (`pe_anchors/assets/digits_reference.{csv,json}`, `digits_verdicts.csv`) from the
committed digits experiment (`nbs/results/digits`); `tests/test_reference.py` fails when they differ from it.

    python tools/write_reference.py
"""
from pathlib import Path
from pe_anchors.reference import REFERENCE_DIR, write_reference
from pe_anchors.report import report_meta
from pe_anchors.results import load_results

ROOT = Path(__file__).resolve().parents[1]
src = ROOT / 'nbs' / 'results' / 'digits' / 'results.csv'
for p in write_reference(load_results(src), 'digits', report_meta(src), REFERENCE_DIR): print(p.relative_to(ROOT))
