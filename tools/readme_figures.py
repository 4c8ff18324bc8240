"""Redraw the figures the README and the landing page show, from the committed results tables (no training).

    python tools/readme_figures.py            # every experiment under nbs/results/ that has a results.csv
"""
from pathlib import Path
import matplotlib
matplotlib.use('Agg')
import matplotlib.pyplot as plt
from pe_anchors.results import load_results
from pe_anchors.figures import fig2, fig_alpha

ROOT = Path(__file__).resolve().parents[1]
FIGURES = {'fig2_rpi': fig2, 'alpha': fig_alpha}

def main():
    for csv in sorted((ROOT / 'nbs' / 'results').glob('*/results.csv')):
        df, name = load_results(csv), csv.parent.name
        if 'ape' not in set(df['condition']): continue           # the paper's conditions only
        for suffix, draw in FIGURES.items():
            if suffix == 'alpha' and 'sweep' in df and not (df['sweep'] == 'alpha').any(): continue
            fig = draw(df)
            dest = ROOT / 'nbs' / 'images' / f"{name}_{suffix}.png"
            fig.savefig(dest, dpi=110, bbox_inches='tight', metadata={'Software': None}); plt.close(fig)
            print(dest.relative_to(ROOT))

if __name__ == '__main__': main()
