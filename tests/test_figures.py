"""The book's figures are legible at the size the page shows them: no text under
``fedlib.plots.MIN_FONT_PT``, no figure wider than ``MAX_WIDTH_IN`` (the browser check then holds
each rendered figure to ``MIN_SCALE``), and a footer that nothing overprints."""

from __future__ import annotations

import json
import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from fedlib import plots  # noqa: E402
from fedlib.results import REPO_ROOT  # noqa: E402

FONTSIZE = re.compile(r"fontsize=([\d.]+)")
FIGSIZE = re.compile(r"figsize=\(([\d.]+),")


def _figure_sources() -> dict[str, str]:
    """The code that draws the book's figures: the notebooks' code cells, the library and studies."""
    out = {}
    for nb in sorted((REPO_ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(nb.read_text())["cells"]
        out[nb.name] = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    for py in [*sorted((REPO_ROOT / "fedlib").rglob("*.py")), *sorted((REPO_ROOT / "studies").rglob("*.py"))]:
        out[str(py.relative_to(REPO_ROOT))] = py.read_text()
    return out


def test_the_legibility_rule_is_consistent():
    assert plots.MIN_SCALE == plots.MIN_TEXT_PX / (plots.MIN_FONT_PT * plots.DPI / 72)
    sizes = {k: v for k, v in plots.STYLE.items() if "size" in k}
    assert sizes and all(v >= plots.MIN_FONT_PT for v in sizes.values()), sizes


def test_no_figure_draws_text_under_the_minimum_or_is_wider_than_the_column():
    small, wide = [], []
    for name, code in _figure_sources().items():
        small += [f"{name}: fontsize={m}" for m in FONTSIZE.findall(code) if float(m) < plots.MIN_FONT_PT]
        wide += [f"{name}: figsize width {m}" for m in FIGSIZE.findall(code) if float(m) > plots.MAX_WIDTH_IN]
    assert small == [] and wide == [], small + wide
    # the scan sees what it is meant to see
    assert FONTSIZE.findall("ax.legend(fontsize=8)") == ["8"] and FIGSIZE.findall("figsize=(11, 4)") == ["11"]


def _extent(artist, renderer):
    return artist.get_window_extent(renderer)


def test_the_footer_sits_under_every_legend_and_axis_in_the_saved_image(tmp_path):
    """A legend placed below the axes (as several pages do) and a figure legend at the figure's
    bottom: in the image as the notebooks save it (a tight bounding box, which re-anchors a figure
    legend to the new bottom unless it is pinned), the footer is drawn under both, overlapping
    nothing. The extents are read in the draw that writes the file."""
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.plot([0, 1], [0, 1], label="a line with a long label")
    ax.set_xlabel("global round")
    below = ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=1)
    bottom = fig.legend(loc="lower center", ncol=2)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    text = plots.add_footer(fig, "profile quick, 3 seeds, cpu, commit abc1234")
    seen = {}

    def measure(event):
        r = event.renderer
        others = [below.get_window_extent(r), bottom.get_window_extent(r), ax.get_tightbbox(r)]
        seen.update(foot=text.get_window_extent(r), others=others)

    fig.canvas.mpl_connect("draw_event", measure)
    fig.savefig(tmp_path / "f.png", bbox_inches="tight")
    assert seen and all(seen["foot"].y1 <= o.y0 for o in seen["others"]), seen
    assert text.get_fontsize() >= plots.MIN_FONT_PT
    plt.close(fig)
