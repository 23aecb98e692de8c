"""Make the Gradescope autograder: `_build/gradescope/autograder.zip`.

    make gradescope       # or: .venv/bin/python tools/make_gradescope.py [ZIP_PATH]

Gradescope extracts the zip into /autograder/source, runs its `setup.sh` once when it
builds the autograder's image, and runs `run_autograder` (copied to /autograder) on
every submission, which must leave /autograder/results/results.json behind
(https://gradescope-autograders.readthedocs.io/en/latest/specs/). So the zip's root holds:

  setup.sh          installs Python, pip, venv and bubblewrap (apt), then, in the
                    virtual environment /autograder/venv, the CPU build of torch and
                    the rest of requirements.txt, which installs the library (`-e .`);
  run_autograder    grades the submitted notebooks with tools/grade.py and turns
                    grades.json into results.json (tools/grading/exports.py); it always
                    writes a valid results.json, score 0 with the reason when there is
                    no notebook or the grader failed. Its root is $AUTOGRADER_ROOT
                    (default /autograder), so that a test can run it in a folder;
  exercises.json    the handout's list of exercises (tools/make_handout.py);
  grading_secret    the assignment's secret, which seeds the random cases (tools/grade.py's
                    --secret), when one is given: MHA_GRADING_SECRET at build time;
  pyproject.toml, requirements.txt, README.md, src/mha/, tools/
                    what grading needs: the library, the grader, and what installs them.

The zip goes to the instructor's Gradescope, never to students; it holds no chapter.
"""

import os
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

from make_handout import make_handout

ROOT = Path(__file__).resolve().parent.parent
ZIP = ROOT / "_build" / "gradescope" / "autograder.zip"
FILES = ["pyproject.toml", "requirements.txt", "README.md"]  # pyproject's `readme` must exist for pip
FOLDERS = ["src/mha", "tools"]
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
ROOT="${AUTOGRADER_ROOT:-/autograder}"
SOURCE="$ROOT/source"
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

NOTEBOOKS=()
while IFS= read -r -d '' notebook; do NOTEBOOKS+=("$notebook"); done < <(
  find "$ROOT/submission" -name '*.ipynb' -not -path '*/.ipynb_checkpoints/*' -print0 2>/dev/null | sort -z)
[ "${#NOTEBOOKS[@]}" -gt 0 ] \\
  || give_zero "No notebook (.ipynb) was submitted: submit the chapter's notebook with your solutions."

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
python3 "$SOURCE/tools/grade.py" --manifest "$SOURCE/exercises.json" --out "$WORK" "${NOTEBOOKS[@]}"
status=$?   # 1: some check failed, which is a grade, not an error
echo "grade.py exited with $status"
STOPPED="The grader stopped before it could grade this submission (exit code $status)."
[ -s "$WORK/grades.json" ] \\
  || give_zero "$STOPPED Check that you submitted the chapter's notebook (.ipynb); if you did, tell your instructor."
python3 "$SOURCE/tools/grading/exports.py" gradescope "$WORK/grades.json" "$RESULTS" \\
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


def make_autograder(zip_path=ZIP, manifest=None, secret=None):
    """Write the autograder's zip to `zip_path`; its path. `manifest`: an exercises.json to ship
    (default: a fresh handout's, made here without its website); `secret`: the assignment's
    secret (default: the environment's MHA_GRADING_SECRET; none: grade.py says so in its report)."""
    zip_path = Path(zip_path)
    secret = secret or os.environ.get("MHA_GRADING_SECRET")
    zip_path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        if manifest is None:
            manifest = make_handout(Path(scratch) / "handout", build_html=False, repository=None) \
                / "student" / "exercises.json"
        partial = zip_path.with_suffix(".partial")
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as archive:
            add_text(archive, "setup.sh", SETUP, executable=True)
            add_text(archive, "run_autograder", RUN_AUTOGRADER, executable=True)
            add_text(archive, "exercises.json", Path(manifest).read_text(encoding="utf-8"))
            if secret:
                add_text(archive, "grading_secret", secret, private=True)
            for name, path in source_files():
                add_text(archive, name, path.read_bytes(), executable=path.stat().st_mode & 0o111)
        shutil.move(partial, zip_path)
    return zip_path


if __name__ == "__main__":
    target = make_autograder(sys.argv[1] if len(sys.argv) > 1 else ZIP)
    with zipfile.ZipFile(target) as archive:
        count = len(archive.namelist())
    print(f"{target}: {count} files, {target.stat().st_size / 1e6:.1f} MB"
          f"{'' if os.environ.get('MHA_GRADING_SECRET') else ', without a secret (set MHA_GRADING_SECRET)'}.\n"
          "Upload it on the assignment's Configure Autograder page (base image: Ubuntu 22.04 or newer).")
