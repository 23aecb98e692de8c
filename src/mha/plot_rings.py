"""Figures of what travels around a ring (chapter 15): the ring all-reduce step by step, and one
rank's ring attention with its compute and its transfers side by side.

Both draw what the library computes: `ring_all_reduce` the states of
`mha.experiments.parallel.ring_all_reduce_steps`, `ring_overlap` the schedules of
`mha.experiments.parallel_costs.ring_timeline`. The chapter calls them as `mha.plot_rings.<name>`.
"""

import matplotlib.pyplot as plt
import numpy as np

from mha.plot_ranks import rank_colours


def ring_all_reduce(states, *, size=2.1):
    """One panel per state of a ring all-reduce: P ranks (rows) x P pieces (columns). A cell's text names
    the ranks whose piece it adds up; its shade grows with their number, and a whole sum is outlined in
    black. A piece sent to reach the state has an arrow-marked edge in the sender's colour. Returns the figure."""
    if not states:
        raise ValueError("states must hold at least the starting state")
    P = len(states[0]["sums"])
    colours = rank_colours(P)
    fig, axes = plt.subplots(1, len(states), figsize=(size * len(states), size + 0.9), layout="constrained",
                             squeeze=False)
    for i, (ax, state) in enumerate(zip(axes.flat, states)):
        sent = {((r + 1) % P, k): r for r, k in state["sent"]}  # (receiver, piece): sender
        for r in range(P):
            for k in range(P):
                who = state["sums"][r][k]
                shade = plt.get_cmap("Greys")(0.08 + 0.5 * (len(who) - 1) / max(P - 1, 1))
                whole = len(who) == P
                ax.add_patch(plt.Rectangle((k, r), 1, 1, facecolor=shade, edgecolor="black",
                                           lw=2.0 if whole else 0.5))
                ax.text(k + 0.5, r + 0.5, "".join(map(str, who)), ha="center", va="center", fontsize=7,
                        color="white" if len(who) > P / 2 else "black")
                if (r, k) in sent:
                    ax.add_patch(plt.Rectangle((k + 0.06, r + 0.06), 0.88, 0.88, fill=False,
                                               edgecolor=colours[sent[r, k]], lw=2.2))
        ax.set_xlim(0, P)
        ax.set_ylim(P, 0)
        ax.set_aspect("equal")
        ax.set_xticks(np.arange(P) + 0.5, labels=[str(k) for k in range(P)], fontsize=7)
        ax.set_yticks(np.arange(P) + 0.5, labels=[f"rank {r}" for r in range(P)] if i == 0 else [""] * P,
                      fontsize=7)
        ax.tick_params(length=0)
        ax.set_xlabel("piece", fontsize=7)
        ax.set_title("start" if state["phase"] == "start" else f"step {i}\n{state['phase']}", fontsize=8)
    fig.suptitle("ring all-reduce: each cell lists the ranks its piece adds up; a coloured frame: "
                 "just received from that rank", fontsize=9)
    return fig


def ring_overlap(timelines, *, unit="ms", scale=1e3):
    """One rank's ring attention, one panel per case: the compute of each step on one lane and the
    transfer of the next key/value block on another, as `ring_timeline` schedules them.
    timelines: {title: (compute, transfers)}, lists of (start, end) in seconds. Returns the figure."""
    if not timelines:
        raise ValueError("timelines must hold at least one case {title: (compute, transfers)}")
    fig, axes = plt.subplots(len(timelines), 1, figsize=(8, 1.5 * len(timelines) + 0.6), layout="constrained",
                             squeeze=False)
    compute_colour, wire_colour = plt.get_cmap("tab10").colors[0], plt.get_cmap("tab10").colors[1]
    for ax, (title, (compute, transfers)) in zip(axes.flat, timelines.items()):
        span = max(end for _, end in compute + transfers)
        for lane, bars, colour in ((1, compute, compute_colour), (0, transfers, wire_colour)):
            for s, (start, end) in enumerate(bars):
                ax.barh(lane, (end - start) * scale, left=start * scale, height=0.6, color=colour,
                        edgecolor="black", lw=0.5)
                if end - start > 0.045 * span:  # room for the step's name: the block computed, or on its way
                    ax.text((start + end) / 2 * scale, lane, f"for s = {s + 1}" if lane == 0 else f"s = {s}",
                            ha="center", va="center", fontsize=7, color="white")
        ax.set_yticks([0, 1], labels=["next block on the wire", "attention on the block held (step s)"], fontsize=8)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel(f"time ({unit})", fontsize=8)
        ax.set_ylim(-0.6, 1.6)
        ax.grid(axis="x", alpha=0.3)
    return fig
