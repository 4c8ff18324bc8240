"""pe_anchors.figures: means and ±1 SD bands over seeds, the paper's values as reported, titles that name the data."""
import statistics as st

import matplotlib
matplotlib.use('Agg')
import matplotlib.pyplot as plt
import numpy as np

from pe_anchors.figures import data_label, fig2, fig3, fig_alpha
from pe_anchors.paper import PAPER_ALPHA
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
    assert 'hand, seeds 0–2' in fig.axes[0].get_title()
    plt.close(fig)


def test_fig_alpha_bands_and_the_papers_points():
    df = three_seeds()
    fig = fig_alpha(df)
    x, y, band = line_and_band(fig.axes[1], 'APE')                        # JPEG FS against α
    fs = {al: v[2] for al, v in ALPHA.items()}
    np.testing.assert_allclose(x, sorted(fs)); np.testing.assert_allclose(y, [st.mean(fs[a]) for a in sorted(fs)])
    for a in fs: assert np.isclose(band, st.mean(fs[a]) + st.stdev(fs[a])).any()
    crossed = [l for l in fig.axes[1].lines if l.get_marker() == 'x']
    assert len(crossed) == 1 and list(crossed[0].get_xdata()) == [.1]     # the near-chance α, crossed out
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
    import matplotlib.colors as mc
    from pe_anchors.core import CONDITIONS
    from pe_anchors.plots import condition_color
    hexes = {c: mc.to_hex(condition_color(c)) for c in CONDITIONS}
    same = [(a, b) for i, a in enumerate(hexes) for b in list(hexes)[i + 1:] if hexes[a] == hexes[b]]
    assert not same, f"conditions drawn in the same colour: {same}"
