"""The grader of tools/grade.py, in its own package.

    notebook        one submitted notebook: its chapter, its checks, its rows of grades.csv
    cases           the grader's side of a check: draw the cases, send their inputs, judge the replies
    sandbox         the worker process that runs a student's code, its limits, and who it may be
    bubblewrap      bubblewrap's command line for a worker
    resources       the worker's user, limits, memory cgroup and process tree
    worker          runs inside the sandbox: the relay that holds the grader's pipes, and the runner
    wire            what crosses between grader and worker: plain data, bounded, never pickle
    seccomp         the worker's seccomp filter (no mount, umount, unshare, setns, ptrace)
    student_edition the only library a worker can import: mha.numpy with the exercise switched off
    exports         grades.json to Gradescope's results.json, and totals per student for an LMS

Imported with tools/ on the path (`from grading.notebook import grade_notebook`). worker, wire
and seccomp are copied into each worker's sandbox and import nothing of the grader.
"""
