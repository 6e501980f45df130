"""The report's plots as drawn: nothing in the per-host utilization figure overlaps."""

from __future__ import annotations

import pytest
from shoal.profiler.data import Store
from shoal.profiler.report import plots

from tests.unit.test_profiler_rules import write_system


def text_boxes(ax, renderer):
    """The window extents of an axes' drawn x tick labels and x-axis label."""
    texts = [t for t in ax.get_xticklabels() if t.get_visible() and t.get_text()]
    if ax.xaxis.label.get_text():
        texts.append(ax.xaxis.label)
    return [t.get_window_extent(renderer) for t in texts]


@pytest.mark.parametrize("hosts", [2, 4])
def test_no_host_title_overlaps_another_panels_axis_labels(tmp_path, hosts):
    for n in range(1, hosts + 1):
        write_system(tmp_path, f"algo-{n}", 80, gpus=1, cores=2, cpu=lambda i, c: 30 + i % 50)
    store = Store(tmp_path)
    store.load()
    fig = plots.utilization_figure(store)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    axes = fig.get_axes()
    assert len(axes) == hosts
    for ax in axes:
        title = ax.title.get_window_extent(renderer)
        for other in axes:
            if other is not ax:
                boxes = text_boxes(other, renderer)
                assert boxes and not any(title.overlaps(box) for box in boxes), (
                    f"{ax.get_title()!r} overlaps {other.get_title()!r}'s axis labels")
    plots.plt.close(fig)
