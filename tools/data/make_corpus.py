"""Rebuild the text corpus that `mha.text` reads: CPython 3.11.7's Lib/*.py in one archive.

    .venv/bin/python -m tools.data.make_corpus                      # write src/mha/text/data/
    .venv/bin/python -m tools.data.make_corpus --check              # rebuild in memory, compare bytes
    .venv/bin/python -m tools.data.make_corpus --source DIR         # another copy of Lib/

The source is the top level of the standard library of the python.org CPython 3.11.7 source
release (here pyenv's build of it, /root/.pyenv/versions/3.11.7/lib/python3.11): its 168 `*.py`
files, and its LICENSE.txt, which is copied beside the archive.

The archive is deterministic: the names sorted, every member with the same mode, owner and
modification time (the release date), the tar in USTAR format, compressed by Python's lzma module
with a fixed preset. Rebuilding it with the same liblzma gives the same bytes; SOURCE.md states
their SHA-256.
"""

import argparse
import hashlib
import io
import lzma
import shutil
import sys
import tarfile
from pathlib import Path

VERSION = "3.11.7"
DEFAULT_SOURCE = Path(f"/root/.pyenv/versions/{VERSION}/lib/python3.11")
DATA = Path(__file__).resolve().parents[2] / "src" / "mha" / "text" / "data"
ARCHIVE_NAME = f"cpython-{VERSION}-Lib.tar.xz"
MEMBER_PREFIX = "Lib/"
RELEASE_MTIME = 1701648000  # 2023-12-04 00:00 UTC, the day CPython 3.11.7 was released
EXPECTED_FILES = 168


def source_files(source):
    """The sorted paths of the top-level `*.py` files of a Lib/ folder."""
    paths = sorted(source.glob("*.py"), key=lambda p: p.name)
    if len(paths) != EXPECTED_FILES:
        raise ValueError(f"expected {EXPECTED_FILES} *.py files in {source}, found {len(paths)}")
    for path in paths:
        path.read_bytes().decode("utf-8")  # refuse a file that is not UTF-8
    return paths


def tar_bytes(paths):
    """An uncompressed USTAR archive of the files, with fixed metadata, as bytes."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for path in paths:
            data = path.read_bytes()
            info = tarfile.TarInfo(MEMBER_PREFIX + path.name)
            info.size, info.mtime, info.mode = len(data), RELEASE_MTIME, 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def archive_bytes(source):
    """The compressed archive: the tar of `source`'s files, xz at preset 9 extreme, CRC64 check."""
    raw = tar_bytes(source_files(source))
    return lzma.compress(raw, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64,
                         preset=9 | lzma.PRESET_EXTREME)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, default=DEFAULT_SOURCE)
    parser.add_argument("--check", action="store_true", help="compare with the stored archive")
    args = parser.parse_args(argv)
    data = archive_bytes(args.source)
    digest = hashlib.sha256(data).hexdigest()
    target = DATA / ARCHIVE_NAME
    if args.check:
        same = target.exists() and target.read_bytes() == data
        print(f"{ARCHIVE_NAME}: sha256 {digest}, {'identical' if same else 'DIFFERENT'}")
        return 0 if same else 1
    DATA.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    shutil.copyfile(args.source / "LICENSE.txt", DATA / "LICENSE.txt")
    print(f"wrote {target} ({len(data)} bytes), sha256 {digest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
