"""The course's tools, one package per trade. Each runs from the repository root as a module
(`python -m tools.grading.grade --help`); each package's docstring names all of its modules.

    grading/      grade the students' notebooks in a sandbox; the Gradescope autograder; exports for an LMS
    publishing/   the book's notebooks, PDF and Colab cell; the instructors' handout and its nbgrader version
    data/         for maintainers: the corpus, its baselines, the trained models and the seed tables in src/mha
"""
