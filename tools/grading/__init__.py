"""Grading: a submitted notebook's checks, run by the grader on the student's code in a sandbox.

    grade.py            the command: grade notebooks for an assignment, write grades.csv and grades.json
    make_gradescope.py  the command: one assignment's Gradescope autograder (a zip that runs grade.py)
    exports.py          grades.json to Gradescope's results.json, and totals per student for an LMS
    notebook.py         one submitted notebook: its chapter, its checks, its rows of grades.csv
    check_cells.py      has a submission kept the handout's check cells? (printed over, renamed, edited, removed)
    copies.py           is a graded function the library's code or a listing of its chapter? (the `copy` column)
    syntax_rules.py     the exercise's rules on the student's syntax (mha.checks.syntax), read by the grader itself
    notebook_slice.py   the statements of a notebook that the checked functions depend on
    cases.py            the grader's side of a check: draw the cases, send their inputs, judge the replies
    sandbox.py          the worker process that runs a student's code, its limits, and who it may be
    bubblewrap.py       bubblewrap's command line for a worker
    resources.py        the worker's user, limits, memory cgroup and process tree
    student_edition.py  the only library a worker can import: mha.numpy with the exercise switched off
    worker.py           runs inside the sandbox: the relay that holds the grader's pipes, and the runner
    wire.py             what crosses between grader and worker: plain data, bounded, never pickle
    seccomp.py          the worker's seccomp filter (no mount, umount, unshare, setns, ptrace)

Run from the repository root: `python -m tools.grading.grade --help`. Imported as
`from tools.grading import grade` (it reads the handout's list of exercises from
tools.publishing.handout_manifest). worker, wire and seccomp are copied into each worker's
sandbox, where the worker runs as a script beside the other two: they import nothing of the grader.
"""
