"""Every symbol in the chapters' mathematics is defined on the notation page (book/notation.md).

A symbol is a Latin letter or a Greek letter, with its subscript when the subscript is part of
its name: a role ($W_Q$, $T_k$, $d_v$), a word ($d_{\\text{head}}$), or the layer of the
feed-forward network ($W_1$, $b_2$). An index subscript ($x_i$, $s_{ij}$, $W_{Q,i}$), or a word
that names a token ($x_{\\text{cash}}$), belongs to the letter it indexes: defining $x$ and $s$ and $W_Q$ covers them.
"""

import json
import re

import pytest

from conftest import ROOT, toc_files

MATH = re.compile(r"\$\$(.+?)\$\$|\$(.+?)\$", re.S)
GREEK = ("alpha beta gamma delta epsilon varepsilon eta theta vartheta lambda mu nu xi pi rho sigma tau phi "
         "varphi chi psi omega Gamma Delta Theta Lambda Pi Sigma Phi Psi Omega").split()
WORD_SUBSCRIPT = re.compile(r"_\{\\(?:text|mathrm)\{([A-Za-z ]+)\}\}")  # d_{\text{head}} -> d_{@head}
WORDS = re.compile(r"\\(?:text|mathrm|operatorname|mathbb|mathcal|mathbf|textbf|begin|end)\s*\{[^{}]*\}")
SUBSCRIPT = r"_(?:\{(?:[^{}]|\{[^{}]*\})*\}|\\[A-Za-z]+|[A-Za-z0-9])"
SYMBOL = re.compile(r"(?<![\\A-Za-z@])([A-Za-z]|\\(?:" + "|".join(GREEK) + r"))(?![A-Za-z])(" + SUBSCRIPT + ")?")
ROLES = {"Q", "K", "V", "O"}  # W_Q ... W_O and b_Q ... b_O; in Q_i, the i is an index (head i)
TOKEN_VECTORS = set("xeqkvy")  # x_{\text{cash}} is the vector of the word "cash": x, indexed
LOWER_ROLES = {"T": {"q", "k"}, "d": {"k", "v"}}  # T_q, T_k, d_k, d_v


def symbol_name(letter, subscript):
    """The name under which a symbol must be defined: `W_Q` for W_{Q,i}, `x` for x_i, `d_head`."""
    inner = (subscript or "_")[1:].strip("{}").split(",")[0].strip()
    if inner.startswith("@"):  # a word: a name (d_head), except on a token's vector, where it names the token
        return letter if letter in TOKEN_VECTORS else f"{letter}_{inner[1:]}"
    if letter in ("W", "b") and inner in ROLES | {"1", "2"}:
        return f"{letter}_{inner}"
    if inner in LOWER_ROLES.get(letter, ()):
        return f"{letter}_{inner}"
    return letter


def symbols_in(text):
    """The names of the symbols in the $...$ and $$...$$ of a Markdown text."""
    names = set()
    for match in MATH.finditer(text):
        maths = WORD_SUBSCRIPT.sub(lambda m: "_{@" + m.group(1).replace(" ", "") + "}", match.group(1) or match.group(2))
        maths = WORDS.sub(" ", maths)  # words (softmax, the reals' R, matrix environments) are not symbols
        names |= {symbol_name(m.group(1), m.group(2)) for m in SYMBOL.finditer(maths)}
    return names


def chapter_markdown(path):
    cells = json.loads(path.read_text())["cells"]
    return "\n".join("".join(cell["source"]) for cell in cells if cell["cell_type"] == "markdown")


CHAPTERS = [ROOT / f"{page}.ipynb" for page in toc_files() if (ROOT / f"{page}.ipynb").exists()]


def test_the_extraction_names_symbols_as_the_notation_page_does():
    found = symbols_in(r"$W_{Q,i}$, $x_i$, $s_{ij}$, $d_{\text{head}}$, $T_k$, $W_1 x + b_1$, $e^{\tau}$, "
                       r"$\mathbb{R}^{T \times d}$, $\text{softmax}(S)$, $d_v$")
    assert found == {"W_Q", "x", "s", "d_head", "T_k", "W_1", "b_1", "e", "\\tau", "T", "d", "S", "d_v"}


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_every_symbol_of_the_chapter_is_on_the_notation_page(chapter):
    defined = symbols_in((ROOT / "book" / "notation.md").read_text())
    missing = sorted(symbols_in(chapter_markdown(chapter)) - defined)
    assert not missing, f"{chapter.name} uses symbols that book/notation.md does not define: {missing}"


def test_every_row_of_the_notation_page_is_in_a_table():
    """A row after a blank line starts no table (a table needs its header): it would print as a line of pipes."""
    lines = (ROOT / "book" / "notation.md").read_text().splitlines()
    for i, line in enumerate(lines):
        if line.startswith("|") and not line.startswith("| ---") and i + 1 < len(lines) and lines[i + 1].startswith("| ---"):
            continue  # a header
        if line.startswith("|"):
            above = lines[i - 1]
            assert above.startswith("|"), f"line {i + 1} of notation.md is a row outside a table: {line[:60]}"
