"""pe_anchors.figures and plots: means and ±1 SD bands over seeds, the paper's values as reported, titles that name the
data; every figure sized for the page with one complete legend outside the data, each condition in its colour and label."""
import statistics as st

import matplotlib
matplotlib.use('Agg')
import matplotlib.colors as mc
import matplotlib.pyplot as plt
import numpy as np
import pytest

from pe_anchors.core import CONDITIONS, condition_label
from pe_anchors.figures import data_label, fig1, fig2, fig3, fig4, fig5, fig_alpha, fig_severity
from pe_anchors.paper import PAPER_ALPHA
from pe_anchors.plots import PAGE_WIDTH, condition_color, plot_fragility, plot_shift_curves, plot_ssdc
from pe_anchors.results import fragility_frame, summarize_fragility
from pe_anchors.testing import synthetic_results
from test_tables import ALPHA, RPI, three_seeds


def line_and_band(ax, label):
    i = [l.get_label() for l in ax.lines].index(label)
    line = ax.lines[i]
    ys = np.concatenate([p.vertices[:, 1] for p in ax.collections[i].get_paths()])   # one band per line, in order
    return line.get_xdata(), line.get_ydata(), ys


def test_fig2_draws_mean_and_sd_bands_over_seeds():
    fig = fig2(three_seeds())
    x, y, band = line_and_band(fig.axes[0], 'APE')
    mean, sd = np.mean(RPI['ape'], axis=0), np.std(RPI['ape'], axis=0, ddof=1)
    np.testing.assert_allclose(y, mean)
    for lo, hi in zip(mean - sd, mean + sd): assert np.isclose(band, lo).any() and np.isclose(band, hi).any()
    assert 'hand, seeds 0–2' in fig._suptitle.get_text()
    plt.close(fig)


def test_fig_alpha_bands_and_the_papers_points():
    df = three_seeds()
    fig = fig_alpha(df)
    x, y, band = line_and_band(fig.axes[1], 'APE')                        # raw JPEG FS against α
    fs = {al: v[2] for al, v in ALPHA.items()}
    np.testing.assert_allclose(x, sorted(fs)); np.testing.assert_allclose(y, [st.mean(fs[a]) for a in sorted(fs)])
    for a in fs: assert np.isclose(band, st.mean(fs[a]) + st.stdev(fs[a])).any()
    crossed = [l for l in fig.axes[1].lines if l.get_marker() == 'x']
    assert len(crossed) == 2 and all(list(c.get_xdata()) == [.1] for c in crossed)   # the near-chance α, raw and above chance
    plt.close(fig)
    spe = df[df.condition == 'ape'].assign(condition='spe')                # an SPE sweep: the paper reports 2 points only
    fig = fig_alpha(spe)
    p = [l for l in fig.axes[1].lines if 'paper' in l.get_label()][0]
    assert p.get_linestyle() == 'None' and list(p.get_xdata()) == PAPER_ALPHA['spe']['alpha']
    plt.close(fig)


def test_fig3_names_the_experiment_not_ours():
    fig = fig3(synthetic_results(seeds=(0, 1)))
    titles = [a.get_title() for a in fig.axes]
    plt.close(fig)
    assert titles[:2] == ['blur (synthetic, seeds 0–1)', 'JPEG (synthetic, seeds 0–1)'] and titles[2:] == ['blur (paper)', 'JPEG (paper)']
    assert not any('ours' in t for t in titles)
    assert data_label(synthetic_results(seeds=(0, 2))) == 'synthetic, seeds 0, 2'


def test_every_named_condition_has_its_own_colour():
    hexes = {c: mc.to_hex(condition_color(c)) for c in CONDITIONS}
    same = [(a, b) for i, a in enumerate(hexes) for b in list(hexes)[i + 1:] if hexes[a] == hexes[b]]
    assert not same, f"conditions drawn in the same colour: {same}"


# ---------------------------------------------------------------------------------------------------------------------
# Every figure-making function: sized for the page, one complete legend outside the data, one colour per condition

def _table():
    return synthetic_results(seeds=(0, 1, 2), depth=4)


def _figures():
    df = _table()
    summ = summarize_fragility(fragility_frame(df))
    yield 'fig1', fig1(df); yield 'fig2', fig2(df); yield 'fig3', fig3(df); yield 'fig4', fig4(df)
    yield 'fig5', fig5(df); yield 'fig_alpha', fig_alpha(df)
    yield 'plot_fragility', plot_fragility(summ)
    yield 'plot_ssdc', plot_ssdc(df[df.stage == 'trained'], mode='rpi', legend='outside').figure


@pytest.fixture(scope='module')
def figures():
    figs = dict(_figures())
    yield figs
    plt.close('all')


def _drawn_width(fig) -> float:
    "The width, in inches, of the PNG the notebook saves (bbox 'tight': legends and titles included)."
    fig.canvas.draw()
    return fig.get_tightbbox(fig.canvas.get_renderer()).width


def test_figures_fit_the_page(figures):
    "Shown at ≥ 60 % of its drawn size in an 800 px column; here within the page width itself (100 dpi)."
    wide = {n: round(float(_drawn_width(f)), 2) for n, f in figures.items() if _drawn_width(f) > PAGE_WIDTH * 1.06}
    assert not wide, f"figures wider than the page ({PAGE_WIDTH} in): {wide}"


def _legend_texts(fig) -> set:
    return {t.get_text() for lg in [*fig.legends, *[a.get_legend() for a in fig.axes if a.get_legend()]] for t in lg.get_texts()}


def test_legends_are_complete_and_outside_the_data(figures):
    bad = []
    for name, fig in figures.items():
        fig.canvas.draw()
        r = fig.canvas.get_renderer()
        texts = _legend_texts(fig)
        for ax in fig.axes:
            if not ax.axison: continue
            lg = ax.get_legend()
            if lg is not None and lg.get_window_extent(r).overlaps(ax.get_window_extent(r)):
                bad.append(f"{name}: a legend inside the axes '{ax.get_title()}'")
            bars = {id(a) for c in ax.containers for a in c.get_children()}   # point plots: the x ticks and y label say it
            for l in ax.lines:                                            # every drawn line or marker is explained
                if id(l) in bars: continue
                lab = l.get_label()
                data = len(l.get_xdata()) > 0 and not (len(set(np.atleast_1d(l.get_ydata()))) == 1 and len(l.get_xdata()) == 2
                                                        and l.get_xdata()[0] == 0 and l.get_xdata()[-1] == 1)   # axhline
                if data and not lab.startswith('_') and lab not in texts: bad.append(f"{name}: '{lab}' not in a legend")
                if data and lab.startswith('_') and l.get_marker() not in ('None', None, '', 'o') : bad.append(f"{name}: an unlabelled marker")
            bands = [c for c in ax.collections if id(c) not in bars and c.get_label().startswith('_')]
            if bands and '±1 SD over seeds' not in texts:
                bad.append(f"{name}: bands without a legend entry")
        for lg in fig.legends:
            box = lg.get_window_extent(r)
            if any(box.overlaps(a.get_window_extent(r)) for a in fig.axes if a.axison):
                bad.append(f"{name}: the figure legend covers a panel")
    assert not bad, '\n'.join(bad)


def test_every_figure_draws_a_condition_in_its_colour_and_label(figures):
    "Each line or marker labelled with a condition's label is in that condition's colour (plots.condition_color)."
    labels = {condition_label(c): c for c in CONDITIONS}
    bad = []
    for name, fig in figures.items():
        for ax in fig.axes:
            for l in ax.lines:
                c = labels.get(l.get_label().split(' (')[0].split(':')[0])
                if c and mc.to_hex(l.get_color()) != mc.to_hex(condition_color(c)):
                    bad.append(f"{name}: {l.get_label()} drawn in {mc.to_hex(l.get_color())}, not {condition_color(c)}")
            ticks = [t.get_text() for t in ax.get_xticklabels()]           # point plots: one colour per condition on the x axis
            for coll, tick in zip([c for c in ax.containers], ticks):
                c = labels.get(tick)
                if c and mc.to_hex(coll.lines[0].get_color()) != mc.to_hex(condition_color(c)):
                    bad.append(f"{name}: {tick} point not in its colour")
    assert not bad, '\n'.join(bad)


def test_figure_functions_take_colours_from_the_one_table():
    """No module of the package and no notebook cell (exported or not) carries colours of its own: a colour literal
    (`'C3'`, `f'C{i}'`, `'tab:red'`, a hex code) or a label made from a condition key (`c.upper()`); every colour and
    label comes from plots.condition_color / condition_colors and core.condition_label (neutral greys and black aside)."""
    import json, re
    import pe_anchors
    from pathlib import Path
    lit = re.compile(r"""f?['"](?:C\d|C\{[^}]*\}|tab:\w+|#[0-9a-fA-F]{6}|#[0-9a-fA-F]{3})['"]|label\s*=\s*\w+\.upper\(\)""")
    pkg = Path(pe_anchors.__file__).parent
    sources = [(f.name, f.read_text()) for f in sorted(pkg.rglob('*.py')) if f.name not in ('plots.py', '_modidx.py')]
    for nb in sorted((pkg.parent / 'nbs').glob('*.ipynb')):
        if nb.stem == '10_plots': continue
        sources += [(f"{nb.name} cell {i}", ''.join(c['source'])) for i, c in enumerate(json.loads(nb.read_text())['cells'])
                    if c['cell_type'] == 'code']
    bad = [f"{where}: {m.group(0)}" for where, src in sources for m in lit.finditer(src)]
    assert not bad, 'colours or labels of their own:\n' + '\n'.join(bad)


def test_a_name_outside_the_table_gets_a_spare_colour_fixed_by_its_name():
    "A CNN, a checkpoint, a condition added later: a colour no named condition has, the same in any process (no hash seed)."
    import os, subprocess, sys
    from pe_anchors.plots import _PALETTE, condition_colors
    named = {mc.to_hex(condition_color(c)) for c in _PALETTE}
    others = ['cnn', 'smooth_f05_x2', 'vit_base_patch16_224.augreg_in1k', 'my_pe', 'spe_x3']
    mine = {n: condition_color(n) for n in others}
    assert not set(mine.values()) & named and all(condition_label(n) == n for n in others)
    code = f"from pe_anchors.plots import condition_color; print([condition_color(n) for n in {others!r}])"
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True,
                         env={**os.environ, 'PYTHONHASHSEED': '123'}).stdout
    assert out.strip() == str(list(mine.values()))
    many = condition_colors(['ape', *[f'model_{i}' for i in range(30)]])       # one figure: all told apart
    assert len(set(many.values())) == 31 and many['ape'] == condition_color('ape')
