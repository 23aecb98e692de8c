"""The grader of tools/grade.py, in its own package.

    notebook        one submitted notebook: its chapter, its checks, its rows of grades.csv
    exports         grades.json to Gradescope's results.json, and totals per student for an LMS

Imported with tools/ on the path (`from grading.notebook import grade_notebook`).
"""
