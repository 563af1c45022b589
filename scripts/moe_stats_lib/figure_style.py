"""How the figures of `plot` and `compare` look: the screen and paper styles, the colours of
series, and the short names of runs in legends and tables.

    SCREEN    the default: sans-serif 8-11 pt on figures about 8 in wide, legends right of the
              panels, PNG at 80 dpi.
    PAPER     --paper: serif 6-8 pt on figures one column wide (3.5 in, the column of a
              two-column paper), legends below the panels, PDF at 300 dpi with the fonts
              embedded as TrueType (Type 42), which journals' checkers and editors take.

A style's fonts reach matplotlib through rc_context only (`with plt.rc_context(style.rc)`), so
drawing figures leaves matplotlib's global settings as they were.

palette(count) is the one source of colours for categorical series (layers, experts, phases,
shadow balancers, runs): no two of its colours are alike, however many are asked.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import os

FONT = {"font.size": 9, "axes.titlesize": 10, "axes.labelsize": 9, "xtick.labelsize": 8,
        "ytick.labelsize": 8, "legend.fontsize": 8, "figure.titlesize": 11}
PAPER_FONT = {"font.family": "serif", "mathtext.fontset": "dejavuserif", "font.size": 7,
              "axes.titlesize": 7.5, "axes.labelsize": 7, "xtick.labelsize": 6,
              "ytick.labelsize": 6, "legend.fontsize": 6, "legend.title_fontsize": 6.5,
              "figure.titlesize": 8, "axes.linewidth": 0.6, "xtick.major.width": 0.6,
              "ytick.major.width": 0.6, "lines.markersize": 3, "pdf.fonttype": 42}


@dataclasses.dataclass(frozen=True)
class Style:
    name: str
    rc: dict               # matplotlib rc parameters, applied with rc_context
    width: float           # inches, of every figure drawn at the style's width
    height_scale: float    # heights of the screen figures are multiplied by this
    panel_cols: int        # panels per row of a grid of panels
    panel_height: float    # inches per row of a grid of panels (0: the caller's)
    legend_locs: tuple     # (first, second) figure legend, outside the panels
    legend_cols: int       # columns of a figure legend
    dpi: int               # default resolution of PNG files and heatmap pixels
    formats: tuple         # default file formats

    @property
    def paper(self):
        return self is PAPER

    def figsize(self, height):
        """(width, height) of a figure `height` inches tall on screen."""
        return self.width, height * self.height_scale


SCREEN = Style("screen", FONT, width=8.0, height_scale=1.0, panel_cols=4, panel_height=0.0,
               legend_locs=("outside right upper", "outside right lower"), legend_cols=1,
               dpi=80, formats=("png",))
PAPER = Style("paper", {**FONT, **PAPER_FONT}, width=3.5, height_scale=0.62, panel_cols=2,
              panel_height=1.45, legend_locs=("outside lower center", "outside upper center"),
              legend_cols=2, dpi=300, formats=("pdf",))

# Colours palette() makes beyond tab20's: hues stepped by the golden ratio (each new hue far from
# the last ones) at three lightness levels (saturation, value) in turn, each taken only when it
# is at least a gap away (RGB distance) from every colour already taken; the gap shrinks by a
# fifth after GAP_TRIES candidates in a row were too close.
GENERATED_LEVELS = ((0.85, 0.75), (0.55, 0.95), (0.95, 0.45))
GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0
FIRST_GAP = 0.3
GAP_TRIES = 30


@functools.lru_cache(maxsize=None)
def palette(count):
    """A tuple of `count` RGBA colours for the series of one figure, no two alike: tab10 up to
    10, tab20 up to 20; beyond, tab20's 20 and then generated ones (GENERATED_LEVELS)."""
    import matplotlib
    from matplotlib.colors import hsv_to_rgb
    if count <= 10:
        return tuple(tuple(matplotlib.colormaps["tab10"](i)) for i in range(count))
    colors = [tuple(matplotlib.colormaps["tab20"](i)) for i in range(min(count, 20))]
    gap, misses, i = FIRST_GAP, 0, 0
    while len(colors) < count:
        saturation, value = GENERATED_LEVELS[i % len(GENERATED_LEVELS)]
        rgb = hsv_to_rgb(((0.05 + i * GOLDEN) % 1.0, saturation, value))
        i += 1
        if all(math.dist(rgb, taken[:3]) >= gap for taken in colors):
            colors.append((*(float(c) for c in rgb), 1.0))
            misses = 0
        else:
            misses += 1
            if misses == GAP_TRIES:
                gap, misses = gap * 0.8, 0
    return tuple(colors)


def short_labels(paths):
    """Names of runs for tables and legends: each file's name without its folder and extension;
    where two names agree, as many of their folders as tell them apart (x/A, y/A); a file named
    twice is numbered (A, A (2)). A link (runs/latest.h5) is named after the file it points to."""
    parts = []
    for path in paths:
        folders = os.path.dirname(os.path.normpath(os.path.abspath(path)))
        name = os.path.basename(os.path.realpath(path))
        parts.append([p for p in folders.split(os.sep) if p] + [os.path.splitext(name)[0]])
    depth = [1] * len(parts)
    while True:
        labels = ["/".join(p[-d:]) for p, d in zip(parts, depth)]
        # Names shared by different files take one more folder each.
        longer = [i for i, label in enumerate(labels) if depth[i] < len(parts[i]) and any(
            labels[j] == label and parts[j] != parts[i] for j in range(len(parts)))]
        if not longer:
            break
        for i in longer:
            depth[i] += 1
    seen = {}
    for i, label in enumerate(labels):
        seen[label] = seen.get(label, 0) + 1
        if seen[label] > 1:
            labels[i] = f"{label} ({seen[label]})"
    return labels
