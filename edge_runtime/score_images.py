"""Images for ``edge-infer score``: an image folder's listing and records (``read_images``), and
where a relative image path in a JSONL/CSV record is taken from (``image_base``). See
``score_inputs``."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path
from typing import Iterator

from . import error_codes as ec
from .errors import InputError
from .score_records import Record

log = logging.getLogger("edge_runtime.score")
_WARNED: set = set()

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")
IMAGE_PATH_FIELDS = ("image", "path", "file")


def image_base(path: Path) -> Path | None:
    """The folder a relative image path in ``path``'s records (a field or column named in
    ``IMAGE_PATH_FIELDS``) is taken from: the input file's folder; None (the working directory)
    for an input that is no regular file (a pipe, ``<(...)``), which has no folder. ``/dev/stdin``
    or ``/dev/fd/N`` redirected from a file: that file's folder, not ``/dev``."""
    try:
        st = os.stat(path)
    except OSError:
        return path.parent
    if not stat.S_ISREG(st.st_mode):
        return None
    if path.absolute().parts[1:2] in (("dev",), ("proc",)):       # a descriptor's alias: where it leads
        return Path(os.path.realpath(path)).parent
    return path.parent


def _image_path(value, field: str, base: Path | None):
    """``value`` of ``field`` as the reader yields it: a relative image path joined to ``base``
    (an absolute one unchanged, ``""`` left empty); any other field or value as it is."""
    if base is not None and field in IMAGE_PATH_FIELDS and isinstance(value, str) and value:
        return str(base / value)
    return value


def _image_entries(path: Path) -> list[tuple[str, Path, OSError | None]]:
    """(relative posix name, path, None) of every image, and (``sub/``, path, the error) of every
    subfolder that cannot be listed (its images are unknown), sorted by the relative name. A folder
    that cannot be listed itself raises ``InputError`` ``input_file_unreadable``."""
    entries: list[tuple[str, Path, OSError | None]] = []

    def unreadable(exc: OSError) -> None:
        where = Path(exc.filename) if exc.filename is not None else path
        if where == path:
            raise InputError(f"cannot read the image folder {path}: {exc.strerror or exc}",
                             code=ec.INPUT_FILE_UNREADABLE)
        entries.append((where.relative_to(path).as_posix() + "/", where, exc))

    links: list[str] = []
    for root, dirs, names in os.walk(path, onerror=unreadable):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        # os.walk does not enter a symlinked subfolder (a loop, or a folder scored twice): said, not silent
        links += [(Path(root) / d).relative_to(path).as_posix() + "/" for d in dirs
                  if os.path.islink(os.path.join(root, d))]
        entries += [(f.relative_to(path).as_posix(), f, None) for f in (Path(root) / n for n in sorted(names)
                    if not n.startswith(".") and Path(n).suffix.lower() in IMAGE_SUFFIXES)]
    if links and (str(path), tuple(links)) not in _WARNED:      # listed for the fingerprint, the count and the
        _WARNED.add((str(path), tuple(links)))                     # records: said once
        log.warning("%d symlinked subfolder(s) of %s not entered, their images not scored: %s%s (score the "
                    "folder they link to, or copy it in)", len(links), path, ", ".join(links[:5]),
                    ", ..." if len(links) > 5 else "")
    return sorted(entries, key=lambda t: t[0])


def image_files(path: Path) -> list[tuple[str, Path]]:
    """(relative posix name, path) of every image ``read_images`` yields, in its order (a subfolder that
    cannot be listed has no image here; ``read_images`` gives it an error record)."""
    return [(rel, f) for rel, f, exc in _image_entries(path) if exc is None]


def read_images(path: Path) -> Iterator[Record]:
    for i, (rel, f, exc) in enumerate(_image_entries(path)):
        if exc is None:
            yield Record(i, rel, str(f))
        else:       # its images are unknown: one record says so, rather than none and no count
            yield Record(i, rel, error=InputError(f"cannot list the folder {rel}: {exc.strerror or exc}; its "
                                                  f"images are not scored", code=ec.INPUT_FILE_UNREADABLE))
