"""Make the Gradescope autograder of ONE assignment: `_build/gradescope/<assignment>/autograder.zip`.

    make gradescope ASSIGNMENT=15    # or: .venv/bin/python -m tools.grading.make_gradescope --assignment 15 [ZIP_PATH]

The assignment is what one grade is given for (tools/publishing/handout_manifest.py): a chapter, by its
number (`15`) or its notebook's stem (`15_heads_across_devices`), or exercises of one chapter
named by their labels, comma-separated (`ex-ch5-split-merge,ex-ch5-multihead`; labels of
several chapters are refused: one assignment is one notebook). There is no default: a zip
without an assignment is refused, so that no autograder can add up several chapters. Make
one zip per Gradescope assignment.

Gradescope extracts the zip into /autograder/source, runs its `setup.sh` once when it
builds the autograder's image, and runs `run_autograder` (copied to /autograder) on
every submission, which must leave /autograder/results/results.json behind
(https://gradescope-autograders.readthedocs.io/en/latest/specs/). So the zip's root holds:

  setup.sh          installs Python, pip, venv and bubblewrap (apt), then, in the
                    virtual environment /autograder/venv, the CPU build of torch and
                    the rest of requirements.txt, which installs the library (`-e .`);
  run_autograder    grades ONE notebook of the submission for the assignment: the one
                    named as the assignment's notebook (`15_heads_across_devices.ipynb`;
                    any other notebook is named in the report and not graded), else the
                    only notebook submitted (tools/grading/exports.py's `choose`). Several
                    notebooks none of which has that name, two of that name, or none at
                    all: 0 points and the reason. It grades the notebook with tools/grading/grade.py
                    (the assignment's checks alone; a notebook of another chapter scores 0,
                    and is named) and turns grades.json into results.json, whose score is at
                    most the assignment's maximum. It always writes a valid results.json,
                    score 0 with the reason when the grader failed. Its root is
                    $AUTOGRADER_ROOT (default /autograder), so that a test can run it in a folder;
  exercises.json    the handout's list of exercises (tools/publishing/make_handout.py), recording the
                    assignment under "assignment" (its name, notebook, exercises and
                    max_points), which tools/grading/grade.py then grades by default;
  grading_secret    the assignment's secret, which seeds the random cases (tools/grading/grade.py's
                    --secret), when one is given: MHA_GRADING_SECRET at build time;
  pyproject.toml, requirements.txt, README.md, src/mha/, tools/
                    what grading needs: the library, the grader, and what installs them.

The zip goes to the instructor's Gradescope, never to students; it holds no chapter. It
overwrites only a zip of its own (one holding run_autograder), and only a path ending in .zip.
"""

import argparse
import json
import os
import re
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "_build" / "gradescope"
FILES = ["pyproject.toml", "requirements.txt", "README.md",  # pyproject's `readme` must exist for pip
         "tools/__init__.py"]
FOLDERS = ["src/mha", "tools/grading", "tools/publishing"]  # the grader and the handout's manifest it reads
# "trained": chapter 14's stored language models (6 MB), which no check reads.
SKIPPED = {"__pycache__", ".ipynb_checkpoints", "trained"}
TORCH = "torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"

SETUP = f"""\
#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder's image (Ubuntu 22.04 or newer).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y python3 python3-pip python3-venv bubblewrap
PYTHON=python3
if ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  apt-get install -y python3.11 python3.11-venv   # Ubuntu 22.04's python3 is 3.10; the pins need 3.11
  PYTHON=python3.11
fi
$PYTHON -m venv /autograder/venv
/autograder/venv/bin/python -m pip install --upgrade pip
/autograder/venv/bin/python -m pip install {TORCH}
cd /autograder/source
/autograder/venv/bin/python -m pip install -r requirements.txt   # the rest; torch is installed; -e . is the library
"""

RUN_AUTOGRADER = """\
#!/usr/bin/env bash
# Gradescope runs this on every submission. Layout under $AUTOGRADER_ROOT (default /autograder):
#   source/ (the zip's contents), submission/ (the student's files), results/results.json (written here).
set -u
ROOT="$(realpath "${AUTOGRADER_ROOT:-/autograder}")"
SOURCE="$ROOT/source"
cd "$SOURCE" || exit 1   # the tools run as modules of the zip's root: python3 -m tools.grading.grade
RESULTS="$ROOT/results/results.json"
mkdir -p "$ROOT/results"
if [ -x "$ROOT/venv/bin/python3" ]; then PATH="$ROOT/venv/bin:$PATH"; fi   # setup.sh made it
if [ -z "${MHA_GRADING_SECRET:-}" ] && [ -s "$SOURCE/grading_secret" ]; then
  MHA_GRADING_SECRET="$(cat "$SOURCE/grading_secret")"; export MHA_GRADING_SECRET
fi

give_zero() {   # $1: why, shown to the student (plain text, no quotes or backslashes)
  printf '{"score": 0, "output": "%s", "output_format": "text", "visibility": "visible", "tests": []}\\n' "$1" \\
    > "$RESULTS"
  echo "$1"
  exit 0
}

CHOSEN="$(python3 -m tools.grading.exports choose "$ROOT/submission" "$SOURCE/exercises.json" \\
  --refusal "$RESULTS")"
status=$?
[ "$status" -ne 3 ] || exit 0   # nothing to grade: results.json says why, with 0 points
[ "$status" -eq 0 ] || give_zero "The grader could not read this submission: tell your instructor."
NOTEBOOK="${CHOSEN%%$'\\n'*}"
NOTE="${CHOSEN#*$'\\n'}"
echo "$NOTE"

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
python3 -m tools.grading.grade --manifest "$SOURCE/exercises.json" --out "$WORK" "$NOTEBOOK"
status=$?   # 1: some check failed, which is a grade, not an error
echo "grade.py exited with $status"
STOPPED="The grader stopped before it could grade this submission (exit code $status)."
[ -s "$WORK/grades.json" ] \\
  || give_zero "$STOPPED Check that you submitted the assignment's notebook (.ipynb); if you did, tell your instructor."
python3 -m tools.grading.exports gradescope "$WORK/grades.json" "$RESULTS" \\
  --manifest "$SOURCE/exercises.json" --note "$NOTE" \\
  || give_zero "The grader could not write its results for this submission: tell your instructor."
"""


def source_files():
    """(path in the zip, file on disk) for everything grading needs, the handout's manifest aside."""
    for name in FILES:
        yield name, ROOT / name
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*")):
            relative = path.relative_to(ROOT)
            if path.is_file() and not SKIPPED & set(relative.parts) and path.suffix != ".pyc" \
                    and not any(p.endswith(".egg-info") for p in relative.parts):
                yield relative.as_posix(), path


def add_text(archive, name, text, executable=False, private=False):
    info = zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0))
    info.external_attr = (0o100600 if private else 0o100755 if executable else 0o100644) << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    archive.writestr(info, text)


def zip_is_ours(path):
    """A zip that this tool wrote (it holds run_autograder), which may be overwritten."""
    try:
        with zipfile.ZipFile(path) as archive:
            return "run_autograder" in archive.namelist()
    except (zipfile.BadZipFile, OSError):
        return False


def default_zip(assignment):
    """_build/gradescope/<the assignment, as a file name>/autograder.zip."""
    return FOLDER / re.sub(r"[^\w.-]+", "_", assignment["name"]).strip("_") / "autograder.zip"


def make_autograder(zip_path=None, manifest=None, secret=None, *, assignment):
    """Write the autograder's zip of `assignment` (tools/publishing/handout_manifest.py: a chapter's number or stem, or
    labels of one chapter's exercises, comma-separated) to `zip_path` (default: default_zip); its path.
    `manifest`: an exercises.json to ship (default: a fresh handout's, made here without its website), with
    the assignment recorded in it; `secret`: the assignment's secret (default: the environment's
    MHA_GRADING_SECRET; none: grade.py says so in its report). ValueError: an assignment that names
    nothing gradable, or a zip path that is not a new .zip or an autograder's zip (nothing overwritten)."""
    from tools.publishing.handout_manifest import find_assignment, with_assignment, write_manifest
    from tools.publishing.make_handout import make_handout
    from tools.publishing.output_folder import file_refusal
    secret = secret or os.environ.get("MHA_GRADING_SECRET")
    refused = lambda path: file_refusal(path, ".zip", zip_is_ours)  # noqa: E731
    if zip_path is not None and refused(zip_path):  # before the minutes of a handout
        raise ValueError(f"tools/grading/make_gradescope.py refuses to write {zip_path}: {refused(zip_path)}. "
                         "Nothing was overwritten.")
    with tempfile.TemporaryDirectory() as scratch:
        if manifest is None:
            manifest = make_handout(Path(scratch) / "handout", build_html=False, repository=None) \
                / "student" / "exercises.json"
        full = json.loads(Path(manifest).read_text(encoding="utf-8"))
        chosen = find_assignment(full, assignment)
        zip_path = Path(zip_path) if zip_path is not None else default_zip(chosen)
        why = refused(zip_path)
        if why:
            raise ValueError(f"tools/grading/make_gradescope.py refuses to write {zip_path}: {why}. "
                             "Nothing was overwritten.")
        shipped = Path(scratch) / "exercises.json"
        write_manifest(with_assignment(full, chosen), shipped)
        zip_path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=zip_path.parent, suffix=".partial", delete=False) as partial:
            pass
        try:
            with zipfile.ZipFile(partial.name, "w", zipfile.ZIP_DEFLATED) as archive:
                add_text(archive, "setup.sh", SETUP, executable=True)
                add_text(archive, "run_autograder", RUN_AUTOGRADER, executable=True)
                add_text(archive, "exercises.json", shipped.read_text(encoding="utf-8"))
                if secret:
                    add_text(archive, "grading_secret", secret, private=True)
                for name, path in source_files():
                    add_text(archive, name, path.read_bytes(), executable=path.stat().st_mode & 0o111)
            os.chmod(partial.name, 0o644)
            os.replace(partial.name, zip_path)
        finally:
            if os.path.exists(partial.name):
                os.unlink(partial.name)
    return zip_path


def arguments(argv):
    parser = argparse.ArgumentParser(description="Make the Gradescope autograder (a zip) of one assignment.")
    parser.add_argument("zip", nargs="?", type=Path, help="where to write the zip (a new .zip, or one this tool "
                        "made; default: _build/gradescope/<assignment>/autograder.zip)")
    parser.add_argument("--assignment", required=True,
                        help="a chapter (`15` or `15_heads_across_devices`), or exercises of one chapter by "
                        "their labels, comma-separated (`ex-ch5-split-merge,ex-ch5-multihead`)")
    parser.add_argument("--manifest", type=Path, help="an exercises.json to ship (default: a fresh handout's)")
    return parser.parse_args(argv)


def main(argv):
    args = arguments(argv)
    try:
        target = make_autograder(args.zip, args.manifest, assignment=args.assignment)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    with zipfile.ZipFile(target) as archive:
        count = len(archive.namelist())
        chosen = json.loads(archive.read("exercises.json"))["assignment"]
    print(f"{target}: {count} files, {target.stat().st_size / 1e6:.1f} MB"
          f"{'' if os.environ.get('MHA_GRADING_SECRET') else ', without a secret (set MHA_GRADING_SECRET)'}.\n"
          f"Assignment: {chosen['name']} ({Path(chosen['notebook']).name}), {chosen['max_points']:g} points "
          "(give the Gradescope assignment these points).\n"
          "Upload it on the assignment's Configure Autograder page (base image: Ubuntu 22.04 or newer).")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
