"""Publishing: the book's notebooks, its PDF and Colab cell, and the instructors' handout.

    execute_notebooks.py  the command: re-execute the chapters in place and store their outputs (make notebooks)
    colab_cell.py         the command: write each chapter's Colab install cell from _config.yml
    make_pdf.py           the command: the whole book as one PDF, printed from the site (make pdf)
    make_handout.py       the command: the students' copy, the answer key and the student website (make handout)
    nbgrader_source.py    the command: the chapters' exercises as nbgrader assignments (make handout)
    handout_manifest.py   the handout's list of exercises, their points and assignments (exercises.json)
    student_copy.py       the students' copy of the course: a repository and a website without solutions
    listings.py           a chapter's `{literalinclude}` listings of library code, found and read
    hidden_listings.py    which listings the students do not see (an exercise's answer, its routes), and the note instead
    output_folder.py      the one rule of every tool that deletes or overwrites what it wrote before

Run from the repository root: `python -m tools.publishing.make_handout --help`.
"""
