"""The yardstick of ``grid.py``: the layer x head grid of a model dump drawn the way one would write it
by hand with NumPy and matplotlib: one axes per head (``Figure.subplots``), one shared colour scale
and one colour bar, fixed margins (no layout engine, the quickest way matplotlib lays out a grid),
saved as a PNG at 120 dpi.

    python benchmarks/grid_yardstick.py dump.npz out.png

``dump.npz`` holds one array ``[layers, batch, heads, Lq, Lk]``; batch entry 0 is drawn.
"""

from __future__ import annotations

import sys

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure


def main(src: str, out: str) -> None:
    with np.load(src) as npz:
        w = npz[npz.files[0]][:, 0]  # [layers, heads, Lq, Lk]
    layers, heads = w.shape[:2]
    fig = Figure(figsize=(1.2 * heads + 1.5, 1.2 * layers + 1))
    FigureCanvasAgg(fig)
    axes = fig.subplots(layers, heads, squeeze=False)
    fig.subplots_adjust(left=0.05, right=0.9, bottom=0.02, top=0.93, wspace=0.05, hspace=0.05)
    vmax = float(w.max())
    image = None
    for li in range(layers):
        for hi in range(heads):
            ax = axes[li, hi]
            image = ax.imshow(w[li, hi], cmap="viridis", vmin=0, vmax=vmax, interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if li == 0:
                ax.set_title(f"head {hi}", fontsize=8)
            if hi == 0:
                ax.set_ylabel(f"layer {li}", fontsize=8)
    fig.colorbar(image, cax=fig.add_axes((0.92, 0.1, 0.02, 0.8)), label="weight")
    fig.suptitle(f"{src}: layers x heads", fontsize=11)
    fig.savefig(out, dpi=120)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
