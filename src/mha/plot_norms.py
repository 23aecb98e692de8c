"""Where a block's norms sit (chapter 13): one sublayer and its residual connection, four ways.

`PLACEMENTS` lists the four arrangements a learner meets, each as the norms it has: before the
sublayer (on its input), after it (on its output, still inside the residual branch), or after the
residual sum (on the stream itself, the original post-norm). `norm_placements` draws them side by
side: the residual stream as a vertical line from the input x up to the output y, the branch that
leaves it, passes the sublayer and joins it again at the sum.
The three of today's models are `mha.torch.LMConfig`'s norm_placement values "pre", "post" (OLMo 2's
norm on the sublayer's output) and "sandwich" (tests/test_plot_norms.py checks them against `LMBlock`).
"""

from dataclasses import dataclass

import matplotlib.pyplot as plt


@dataclass(frozen=True)
class Placement:
    """One arrangement: its title, the models that use it, its LMConfig name (None: not one of today's),
    and its norms: on the sublayer's input, on its output (inside the branch), on the sum (on the stream)."""
    title: str
    models: str
    lm_placement: str
    before: bool
    after: bool
    on_stream: bool


PLACEMENTS = (
    Placement("post-norm", "original transformer", None, before=False, after=False, on_stream=True),
    Placement("pre-norm", "GPT-2, Llama, Mistral, Qwen", "pre", before=True, after=False, on_stream=False),
    Placement("norm on the output", "OLMo 2", "post", before=False, after=True, on_stream=False),
    Placement("sandwich", "Gemma 2, Gemma 3", "sandwich", before=True, after=True, on_stream=False),
)
NORM_COLOUR, SUBLAYER_COLOUR = "#f4c27a", "#9cc3e6"


def _box(ax, x, y, text, colour):
    """A labelled box centred at (x, y)."""
    ax.add_patch(plt.Rectangle((x - 0.55, y - 0.32), 1.1, 0.64, facecolor=colour, edgecolor="black", lw=1,
                               zorder=3))
    ax.text(x, y, text, ha="center", va="center", fontsize=9, zorder=4)


def _arrow(ax, start, end):
    ax.annotate("", xy=end, xytext=start, arrowprops=dict(arrowstyle="-|>", lw=1.2, color="black",
                                                          shrinkA=0, shrinkB=0), zorder=2)


def draw_placement(ax, placement):
    """One arrangement on `ax`: the stream at x = 0, the branch at x = 1.4, boxes stacked upwards."""
    branch = [("Norm", NORM_COLOUR)] * placement.before + [("Sublayer", SUBLAYER_COLOUR)] + \
        [("Norm", NORM_COLOUR)] * placement.after
    split, first = 0.6, 1.4  # where the branch leaves the stream, and the height of its first box
    heights = [first + 1.0 * i for i in range(len(branch))]
    join = heights[-1] + 0.9  # the sum, on the stream
    top = join + (1.8 if placement.on_stream else 0.9)
    ax.plot([0, 0], [0, join - 0.18], color="black", lw=1.2, zorder=1)  # the stream, up to the sum
    ax.plot([0, 1.4], [split, split], color="black", lw=1.2, zorder=1)  # the branch leaves it
    _arrow(ax, (1.4, split), (1.4, heights[0] - 0.32))
    for (text, colour), y in zip(branch, heights):
        _box(ax, 1.4, y, text, colour)
    for low, high in zip(heights, heights[1:]):
        _arrow(ax, (1.4, low + 0.32), (1.4, high - 0.32))
    ax.plot([1.4, 1.4], [heights[-1] + 0.32, join], color="black", lw=1.2, zorder=1)
    _arrow(ax, (1.4, join), (0.18, join))  # the branch joins the stream at the sum
    ax.add_patch(plt.Circle((0, join), 0.18, facecolor="white", edgecolor="black", lw=1.2, zorder=3))
    ax.text(0, join, "+", ha="center", va="center", fontsize=11, zorder=4)
    if placement.on_stream:
        _arrow(ax, (0, join + 0.18), (0, join + 0.58))
        _box(ax, 0, join + 0.9, "Norm", NORM_COLOUR)
        _arrow(ax, (0, join + 1.22), (0, top))
    else:
        _arrow(ax, (0, join + 0.18), (0, top))
    ax.text(0, -0.25, "x", ha="center", va="top", fontsize=11)
    ax.text(0, top + 0.1, "y", ha="center", va="bottom", fontsize=11)
    ax.set_title(f"{placement.title}\n({placement.models})", fontsize=10)
    ax.set_xlim(-0.8, 2.3)
    ax.set_ylim(-0.8, 6.6)
    ax.set_aspect("equal")
    ax.axis("off")
    return ax


def norm_placements(placements=PLACEMENTS, *, figsize=(11, 4.6)):
    """The arrangements side by side, one panel each: returns the figure."""
    fig, axes = plt.subplots(1, len(placements), figsize=figsize, layout="constrained")
    for ax, placement in zip(axes, placements):
        draw_placement(ax, placement)
    fig.suptitle("Where the norms sit around one sublayer (attention or feed-forward)", fontsize=11)
    return fig
