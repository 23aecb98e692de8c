"""Figures of heads across devices (chapter 15): who holds what, drawn from the library's own rules.

Each rank has a colour (`rank_colours`, tab10); `tensor_parallel_weights` draws an attention layer's
four projections split by heads, `rank_grids` panels of cells coloured by the rank that holds or
computes each, `rank_bars` a number per rank. The chapter calls them as `mha.plot.<name>` (mha.plot
imports them from here); the generic figures are in mha.plot.
"""

import matplotlib.pyplot as plt
import numpy as np


def rank_colours(world_size):
    """One colour per rank, 0 .. P-1 (at most 10: the tab10 palette)."""
    if not 1 <= world_size <= 10:
        raise ValueError(f"the diagrams colour up to 10 ranks, got world_size={world_size}")
    return list(plt.get_cmap("tab10").colors[:world_size])


def rank_legend(fig, world_size, *, extra=(), label="rank {r}"):
    """A legend of rank colours under the figure, each named by `label` (a format of r); `extra`:
    more (label, facecolor, hatch) entries."""
    handles = [plt.Rectangle((0, 0), 1, 1, facecolor=c, edgecolor="black", lw=0.5) for c in rank_colours(world_size)]
    labels = [label.format(r=r) for r in range(world_size)]
    for label, facecolor, hatch in extra:
        handles.append(plt.Rectangle((0, 0), 1, 1, facecolor=facecolor, edgecolor="#888888", hatch=hatch, lw=0.5))
        labels.append(label)
    columns = 6 if max(len(text) for text in labels) <= 12 else 2  # long names: two columns, not one wide row
    fig.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), columns), frameon=False,
               fontsize=9)


def _block(ax, x, y, width, height, ranks, colours, text=None):
    """A block of a weight matrix held by `ranks`: one stripe per rank (a replica on each)."""
    stripe = width / len(ranks)
    for i, r in enumerate(ranks):
        ax.add_patch(plt.Rectangle((x + i * stripe, y), stripe, height, facecolor=colours[r], edgecolor="none"))
    ax.add_patch(plt.Rectangle((x, y), width, height, fill=False, edgecolor="black", lw=0.8))
    if text:
        ax.text(x + width / 2, y + height / 2, text, ha="center", va="center", fontsize=7, color="white",
                fontweight="bold")


def tensor_parallel_weights(query_owner, kv_owners, *, ax=None, title=None, d_rows=4):
    """The four projections of an attention layer split by heads, each head's block coloured by its rank.

    query_owner[j]: the rank that holds query head j (its columns of W_Q, its rows of W_O).
    kv_owners[g]: the ranks that hold key/value head g (its columns of W_K and W_V); several ranks
    for a replicated head, drawn as stripes. W_Q, W_K, W_V are drawn d wide-rows tall with one
    column block per head; W_O lies on its side: one row block per query head. Returns the axis.
    """
    query_owner = [int(r) for r in query_owner]
    kv_owners = [[int(r) for r in ranks] for ranks in kv_owners]
    if not query_owner or not kv_owners or any(not ranks for ranks in kv_owners):
        raise ValueError("every query head needs a rank, and every key/value head at least one")
    world_size = max(query_owner + [r for ranks in kv_owners for r in ranks]) + 1
    colours = rank_colours(world_size)
    h, h_kv = len(query_owner), len(kv_owners)
    if ax is None:
        _, ax = plt.subplots(figsize=(0.42 * (h + 2 * h_kv + d_rows) + 2.4, 0.42 * max(h, d_rows) + 1.4))
    x = 0.0
    for name, owners, texts in ((r"$W_Q$", [[r] for r in query_owner], [f"q{j}" for j in range(h)]),
                                (r"$W_K$", kv_owners, [f"k{g}" for g in range(h_kv)]),
                                (r"$W_V$", kv_owners, [f"v{g}" for g in range(h_kv)])):
        for j, ranks in enumerate(owners):
            _block(ax, x + j, 0, 1, d_rows, ranks, colours, texts[j])
        ax.text(x + len(owners) / 2, -0.5, f"{name}\n(columns)", ha="center", va="top", fontsize=9)
        x += len(owners) + 0.8
    for j, r in enumerate(query_owner):  # W_O: row block j, from the top
        _block(ax, x, max(h, d_rows) - 1 - j, d_rows, 1, [r], colours, f"o{j}")
    ax.text(x + d_rows / 2, -0.5, "$W_O$\n(rows)", ha="center", va="top", fontsize=9)
    ax.set_xlim(-0.3, x + d_rows + 0.3)
    ax.set_ylim(-1.6, max(h, d_rows) + 0.3)
    ax.set_aspect("equal")
    ax.axis("off")
    if title:
        ax.set_title(title, fontsize=10)
    return ax


def rank_grids(grids, *, world_size, xlabel, ylabel, texts=None, xticklabels=None, yticklabels=None,
               size=3.2, skipped="masked: skipped", legend="rank {r}"):
    """Panels of cells coloured by the rank that holds (or computes) each one.

    grids: {title: integer array (rows, cols)}, each cell a rank 0 .. P-1, or -1 for a cell that
    no rank computes (drawn white and hatched, labelled `skipped` in the legend). texts: {title:
    array of strings} written in the cells. legend: the name of colour r, a format of r. Returns
    the figure.
    """
    colours = rank_colours(world_size)
    titles = list(grids)
    if not titles:
        raise ValueError("grids must hold at least one panel")
    fig, axes = plt.subplots(1, len(titles), figsize=(size * len(titles) + 0.4, size * 0.9 + 1.0),
                             squeeze=False, layout="constrained")
    any_skipped = False
    for i, (ax, title) in enumerate(zip(axes.flat, titles)):
        grid = np.asarray(grids[title])
        if grid.ndim != 2 or grid.min() < -1 or grid.max() >= world_size:
            raise ValueError(f"grids[{title!r}] must be 2-D with ranks from 0 to {world_size - 1} (or -1), "
                             f"got shape {grid.shape} and values from {grid.min()} to {grid.max()}")
        rows, cols = grid.shape
        for (row, col), r in np.ndenumerate(grid):
            if r < 0:
                any_skipped = True
                ax.add_patch(plt.Rectangle((col, row), 1, 1, facecolor="white", edgecolor="#bbbbbb",
                                           hatch="////", lw=0.5))
            else:
                ax.add_patch(plt.Rectangle((col, row), 1, 1, facecolor=colours[r], edgecolor="white", lw=1))
            if texts is not None and title in texts:
                ax.text(col + 0.5, row + 0.5, str(np.asarray(texts[title])[row, col]), ha="center", va="center",
                        fontsize=7, color="black" if r < 0 else "white", fontweight="bold")
        ax.set_xlim(0, cols)
        ax.set_ylim(rows, 0)
        ax.set_aspect("equal")
        ax.set_xticks(np.arange(cols) + 0.5, labels=xticklabels if xticklabels is not None else range(cols),
                      fontsize=7)
        ax.set_yticks(np.arange(rows) + 0.5, labels=yticklabels if yticklabels is not None else range(rows),
                      fontsize=7)
        ax.tick_params(length=0)
        ax.set_xlabel(xlabel, fontsize=9)
        ax.set_ylabel(ylabel if i == 0 else "", fontsize=9)
        ax.set_title(title, fontsize=10)
    rank_legend(fig, world_size, extra=[(skipped, "white", "////")] if any_skipped else (), label=legend)
    return fig


def rank_bars(counts, *, ylabel, title=None, ax=None):
    """Side-by-side bars per rank: counts = {series: [value of rank 0, 1, ...]}, each bar labelled."""
    names = list(counts)
    if not names:
        raise ValueError("counts must hold at least one series")
    world_size = len(counts[names[0]])
    if any(len(v) != world_size for v in counts.values()):
        raise ValueError(f"every series needs one value per rank: lengths {[len(v) for v in counts.values()]}")
    if ax is None:
        _, ax = plt.subplots(figsize=(1.2 * world_size + 2.5, 3.4), layout="constrained")
    width = 0.8 / len(names)
    series_colours = plt.get_cmap("Set2").colors
    for i, name in enumerate(names):
        x = np.arange(world_size) + (i - (len(names) - 1) / 2) * width
        bars = ax.bar(x, counts[name], width, label=name, color=series_colours[i % len(series_colours)],
                      edgecolor="black", lw=0.5)
        ax.bar_label(bars, padding=2, fontsize=8)
    ax.set_xticks(range(world_size), labels=[f"rank {r}" for r in range(world_size)])
    ax.set_ylabel(ylabel)
    ax.margins(y=0.15)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=9)
    if title:
        ax.set_title(title, fontsize=10)
    return ax
