"""The one rule of every tool here that deletes or overwrites what it wrote before.

A tool writes only into a folder that is new, empty, or its own: one that holds the tool's
marker file, which the tool writes into every folder it makes (`.mha-handout` for
tools/publishing/make_handout.py, `.mha-nbgrader` for tools/publishing/nbgrader_source.py). Inside the course
repository it writes only into its default folder (`_handout/`), which is git-ignored: a
path such as `book` or `.` is refused, whatever it holds. Anything else is refused before
anything is deleted, with an error that names the folder and says why (`FolderRefused`).
A file the tool overwrites (a zip, a PDF) must be one of its own kind, or new.

    python -m tools.publishing.output_folder --check DIR --marker .mha-handout   # would a tool write there?
"""

import argparse
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


class FolderRefused(ValueError):
    """A tool's output path that is not its own to write: nothing was deleted."""


def is_within(path, folder):
    return path == folder or folder in path.parents


def refusal(folder, marker, default=None, known=()):
    """Why a tool that marks its folders with `marker` may not write into `folder`, or None.
    `default`: the tool's own folder in the repository; `known`: the names that a folder made by an
    earlier version of the tool (before markers) holds, accepted in `default` alone."""
    folder = Path(folder).resolve()
    default = Path(default).resolve() if default else None
    if is_within(ROOT, folder):
        return f"{folder} holds the course repository ({ROOT})"
    if is_within(folder, ROOT) and folder != default:
        allowed = f" (its own folder there is {default.relative_to(ROOT)}/)" if default else ""
        return f"{folder} is inside the course repository{allowed}: write elsewhere, or into the default"
    if not folder.exists() and not folder.is_symlink():
        return None
    if not folder.is_dir():
        return f"{folder} exists and is not a folder"
    entries = {p.name for p in folder.iterdir()}
    if not entries or marker in entries:
        return None
    if folder == default and known and entries <= set(known):
        return None  # made by an earlier version of the tool, which wrote no marker
    shown = ", ".join(sorted(entries)[:5]) + (", ..." if len(entries) > 5 else "")
    return (f"{folder} is not empty ({shown}) and holds no {marker}, so it was not made by this tool: "
            f"choose a new or empty folder")


def claim(folder, marker, tool, default=None, known=(), empty=True):
    """Make `folder` the tool's own, or raise FolderRefused (nothing deleted). `empty`: clear what an
    earlier run wrote there (the folder holds `marker`); else keep it (the tool replaces what it
    rewrites). Returns the folder, resolved, with the marker in it."""
    why = refusal(folder, marker, default, known)
    if why:
        raise FolderRefused(f"{tool} refuses to write into {folder}: {why}. Nothing was deleted.")
    folder = Path(folder).resolve()
    if empty and folder.exists() and any(folder.iterdir()):
        shutil.rmtree(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / marker).write_text(f"Made by {tool}. Its next run deletes this folder and writes it again.\n")
    return folder


def file_refusal(path, suffix, is_ours):
    """Why a tool may not overwrite the file `path` (which must end in `suffix` and, if it exists, pass
    `is_ours`), or None."""
    path = Path(path)
    if path.suffix != suffix:
        return f"{path} does not end in {suffix}"
    if path.is_dir():
        return f"{path} is a folder"
    if path.exists() and not is_ours(path):
        return f"{path} exists and is not a {suffix} file made by this tool"
    return None


def main(argv):
    parser = argparse.ArgumentParser(description="Say whether a tool that marks its folders with MARKER would "
                                     "write into DIR (exit 0) or refuse it (exit 1, with the reason).")
    parser.add_argument("--check", required=True, type=Path, metavar="DIR")
    parser.add_argument("--marker", required=True)
    args = parser.parse_args(argv)
    why = refusal(args.check, args.marker)
    print(why or f"{args.check}: a tool marking with {args.marker} may write there")
    return 1 if why else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
