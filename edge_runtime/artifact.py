"""Reading, verifying and writing artifact directories.

Loading refuses, with an ``ArtifactError`` naming the file and the reason:
a missing file, a hash or size mismatch, a manifest that does not parse or
misses a field, an unknown format version, and any path that leaves the
artifact directory (absolute, ``..``, or a symlink pointing outside).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path, PurePosixPath

from . import manifest as mf
from . import error_codes as ec
from .errors import ArtifactError
from .records import Manifest, Variant
from .value import Frozen, Record


def sha256_file(path: str | os.PathLike) -> str:
    """The file's sha256, read into one reused buffer (``hashlib.file_digest``). Never through a
    memory map: a file truncated while it is hashed would kill the process with SIGBUS instead of
    failing the hash."""
    return _hash_stamped(path)[0]


Stamp = tuple[int, int, int, int, int]      # st_size, st_mtime_ns, st_ctime_ns, st_ino, st_dev


def _stamp(st: os.stat_result) -> Stamp:
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)


def _hash_stamped(path: str | os.PathLike) -> tuple[str, Stamp]:
    """The sha256 and the stamp of the very file hashed (``fstat`` of the open file, taken before
    its first byte is read: a write during the hash, or a file swapped in after, changes it)."""
    with open(path, "rb") as fh:
        stamp = _stamp(os.fstat(fh.fileno()))
        return hashlib.file_digest(fh, "sha256").hexdigest(), stamp


PARALLEL_HASH_BYTES = 8 << 20    # files at least this large are hashed side by side (hashlib drops the GIL)


def safe_relpath(root: Path, rel: str) -> Path:
    """Resolve ``rel`` inside ``root``; refuse anything that escapes it."""
    if not isinstance(rel, str) or not rel or "\x00" in rel or "\\" in rel:
        raise ArtifactError("invalid file path in manifest", file=str(rel), code=ec.ARTIFACT_PATH_INVALID)
    try:        # a lone surrogate (a JSON "\\ud800" escape) names no file: os.stat raised UnicodeEncodeError
        os.fsencode(rel)
    except UnicodeError:
        raise ArtifactError("file path is not encodable text", file=ascii(rel),
                            code=ec.ARTIFACT_PATH_INVALID) from None
    pure = PurePosixPath(rel)
    if pure.is_absolute() or rel.startswith("/") or (len(rel) > 1 and rel[1] == ":"):
        raise ArtifactError("absolute path is not allowed", file=rel, code=ec.ARTIFACT_PATH_ESCAPES)
    if any(part in ("..", "") for part in rel.split("/")):
        raise ArtifactError("path leaves the artifact directory", file=rel, code=ec.ARTIFACT_PATH_ESCAPES)
    candidate = root.joinpath(*pure.parts)
    # every component must stay inside root, symlinks included
    real_root = root.resolve()
    try:
        real = candidate.resolve(strict=False)
    except (OSError, RuntimeError) as exc:  # symlink loops
        raise ArtifactError(f"path cannot be resolved: {exc}", file=rel, code=ec.ARTIFACT_PATH_INVALID) from None
    if real != real_root and real_root not in real.parents:
        raise ArtifactError("path (or a symlink in it) points outside the artifact directory", file=rel,
                            code=ec.ARTIFACT_PATH_ESCAPES)
    return candidate


class Artifact(Frozen):
    """A parsed, validated artifact: its manifest is read-only (``frozen.FrozenDict``) and the
    record itself is never changed (``verified``: every file was hashed when it was built)."""

    root: Path
    manifest: Manifest
    verified: bool
    verify_ms: float

    def __init__(self, root: Path, manifest: Manifest, verified: bool = False, verify_ms: float = 0.0) -> None:
        d = self.__dict__
        d["root"], d["manifest"], d["verified"], d["verify_ms"] = root, manifest, verified, verify_ms

    @property
    def name(self) -> str:
        return self.manifest["model"]["name"]

    @property
    def version(self) -> str:
        return self.manifest["model"]["version"]

    @property
    def task(self) -> str:
        return self.manifest["task"]

    @property
    def variants(self) -> list[Variant]:
        return self.manifest["variants"]

    def path(self, rel: str) -> Path:
        return safe_relpath(self.root, rel)

    def read_bytes(self, rel: str) -> bytes:
        """A file the manifest lists (hashed by the load's verify); any other path, even inside the
        directory, is refused: a task or inspect never reads an unpinned file."""
        if isinstance(rel, str) and rel not in self.manifest["files"]:
            raise ArtifactError("file is not listed in the manifest (not pinned by a sha256)", file=str(rel),
                                code=ec.ARTIFACT_FILE_UNLISTED)
        try:
            return self.path(rel).read_bytes()
        except OSError as exc:
            raise _unreadable(rel, exc) from None

    def read_text(self, rel: str) -> str:
        """UTF-8 text, a leading BOM dropped (as the tasks read labels: inspect showed '\\ufeffcat')."""
        try:
            return self.read_bytes(rel).decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise ArtifactError(f"not UTF-8 text: {exc}", file=rel, code=ec.ARTIFACT_FILE_INVALID) from None

    def variant(self, target: str) -> Variant:
        for v in self.variants:
            if v["target"] == target:
                return v
        raise ArtifactError(f"artifact has no {target!r} variant (has: {', '.join(self.targets())})",
                            file=mf.MANIFEST_NAME, code=ec.ARTIFACT_VARIANT_MISSING)

    def targets(self) -> list[str]:
        return [v["target"] for v in self.variants]


def load_artifact(path: str | os.PathLike, *, verify: bool = True) -> Artifact:
    import time

    t0 = time.perf_counter()
    root = Path(path)
    mpath = root / mf.MANIFEST_NAME
    try:        # no permission on a folder on the way: the operator's to fix, like any unreadable file
        if not root.exists():
            raise ArtifactError("artifact directory does not exist", file=str(root), code=ec.ARTIFACT_MISSING)
        if not root.is_dir():
            raise ArtifactError("artifact is not a directory", file=str(root), code=ec.ARTIFACT_NOT_DIRECTORY)
        if mpath.is_symlink():
            raise ArtifactError("manifest must not be a symlink", file=mf.MANIFEST_NAME,
                                code=ec.ARTIFACT_PATH_ESCAPES)
        if not mpath.is_file():
            raise ArtifactError("missing manifest", file=mf.MANIFEST_NAME, code=ec.ARTIFACT_FILE_MISSING)
        size = mpath.stat().st_size
        if size > mf.MAX_MANIFEST_BYTES:
            raise ArtifactError(f"manifest is {size} bytes, over the {mf.MAX_MANIFEST_BYTES} byte limit",
                                file=mf.MANIFEST_NAME, code=ec.MANIFEST_TOO_LARGE)
        raw = mpath.read_bytes()
    except OSError as exc:
        raise _unreadable(str(mpath), exc) from None
    data = mf.parse(raw)
    art = Artifact(root=root, manifest=data)
    if not verify:
        return art
    verify_files(art)
    return art.replace(verified=True, verify_ms=(time.perf_counter() - t0) * 1000)


def variant_files(manifest: dict, variant: dict) -> list[str]:
    """The files one variant runs on: its own bucket files and every file no
    other variant owns (tokenizer, labels, ...) but the probe set, which only a
    verify reads (it is hashed with the other variants' files, meanwhile)."""
    def owned(v):
        return {rel for b in v["buckets"] for rel in [b["file"], *b.get("extra_files", [])]}

    probe = manifest.get("probe") or {}
    others = set().union(*(owned(v) for v in manifest["variants"] if v is not variant))
    others |= {probe[k] for k in ("inputs", "reference") if k in probe}
    others -= owned(variant)        # its own files first: one that is also the probe's is still hashed now
    return [rel for rel in manifest["files"] if rel not in others]


def verify_files(art: Artifact, only: list[str] | None = None) -> dict[str, Stamp]:
    """sha256 and size of every listed file, or of ``only`` those. Returns each file's stamp at
    hash time (size, mtime, ctime, inode, device) for :func:`check_unchanged`."""
    wanted = None if only is None else set(only)
    todo: list[tuple[str, Path, dict]] = []
    for rel, entry in art.manifest["files"].items():
        if wanted is not None and rel not in wanted:
            continue
        p = safe_relpath(art.root, rel)
        try:        # a folder on the way without permission makes these raise, not answer False
            if not p.exists() and not p.is_symlink():
                raise ArtifactError("file listed in the manifest is missing", file=rel, code=ec.ARTIFACT_FILE_MISSING)
            if not p.is_file():
                raise ArtifactError("not a regular file", file=rel, code=ec.ARTIFACT_FILE_INVALID)
            actual_size = p.stat().st_size
        except OSError as exc:
            raise _unreadable(rel, exc) from None
        if actual_size != entry["bytes"]:
            raise ArtifactError(f"size mismatch: manifest says {entry['bytes']} bytes, file has {actual_size}",
                                file=rel, code=ec.ARTIFACT_HASH_MISMATCH)
        todo.append((rel, p, entry))
    big = [p for _, p, e in todo if e["bytes"] >= PARALLEL_HASH_BYTES]
    digests: dict[Path, tuple[str, Stamp] | OSError] = {}
    if len(big) > 1 and (os.cpu_count() or 1) > 1:    # every file hashed before any is loaded, side by side
        from concurrent.futures import ThreadPoolExecutor

        def one(p: Path) -> tuple[str, Stamp] | OSError:
            try:
                return _hash_stamped(p)
            except OSError as exc:
                return exc

        with ThreadPoolExecutor(max_workers=min(len(big), os.cpu_count() or 1)) as pool:
            digests = dict(zip(big, pool.map(one, big)))
    stamps: dict[str, Stamp] = {}
    for rel, p, entry in todo:                    # failures reported in manifest order
        done = digests.get(p)
        try:
            if done is None:
                done = _hash_stamped(p)
            elif isinstance(done, OSError):
                raise done
        except OSError as exc:
            raise _unreadable(rel, exc) from None
        digest, stamps[rel] = done
        if digest != entry["sha256"]:
            raise ArtifactError(f"sha256 mismatch: manifest {entry['sha256'][:12]}…, file {digest[:12]}…",
                                file=rel, code=ec.ARTIFACT_HASH_MISMATCH)
    return stamps


def check_unchanged(art: Artifact, stamps: dict[str, Stamp]) -> None:
    """Every file in ``stamps`` (what :func:`verify_files` returned) is still the one hashed: same
    size, mtime, ctime, inode and device. A backend opens a model by path after the hash; a file
    edited in place (through a hard link, by a build writing into the directory) or replaced
    between the two ran bytes no hash had checked. Call it after the files were loaded. An
    ``os.stat`` per file (a few µs): it catches a change the file system records, not one that
    keeps every field (a write within the file system's timestamp tick that keeps the size)."""
    for rel, stamp in stamps.items():
        try:
            now = _stamp(os.stat(os.path.join(art.root, rel)))     # rel: checked by safe_relpath at hash
        except OSError as exc:
            raise ArtifactError(f"file changed after it was hashed (it cannot be read now: "
                                f"{exc.strerror or exc})", file=rel, code=ec.ARTIFACT_HASH_MISMATCH) from None
        # written again with the same bytes (coremltools rewrites an .mlpackage's Manifest.json in place each
        # time it opens the package) is the verified file still: hashed again only when the stamp moved
        if now != stamp and not _same_bytes(art, rel):
            what = [name for name, a, b in zip(("size", "mtime", "ctime", "inode", "device"), stamp, now) if a != b]
            raise ArtifactError(f"file changed after it was hashed ({', '.join(what)} differ, and so do its "
                                "bytes): what was loaded is not what was verified", file=rel,
                                code=ec.ARTIFACT_HASH_MISMATCH)


def _same_bytes(art: Artifact, rel: str) -> bool:
    """A file written since its hash still holds the manifest's bytes: a vendor that rewrites what it
    read (coremltools writes an ``.mlpackage``'s ``Manifest.json`` back when it opens the package)
    changed no byte of it. Hashed again only then. An edit undone before this look (the bytes read in
    between were others) is not seen: the bytes now are the ones verified."""
    entry = art.manifest["files"].get(rel) or {}
    try:
        return _hash_stamped(os.path.join(art.root, rel))[0] == entry.get("sha256")
    except OSError:
        return False


def _unreadable(rel: str, exc: OSError) -> ArtifactError:
    return ArtifactError(f"file cannot be read: {exc.strerror or exc}", file=rel, code=ec.ARTIFACT_FILE_UNREADABLE)


class BackgroundVerify:
    """``verify_files(art, files)`` on a daemon thread (hashlib releases the GIL on
    large buffers, so this overlaps a device's compile and warm-up); ``wait()``
    returns its milliseconds or raises its ``ArtifactError``; ``stamps`` then holds what
    :func:`check_unchanged` compares."""

    def __init__(self, art: Artifact, files: list[str]):
        import threading

        self._error: BaseException | None = None
        self._ms = 0.0
        self.stamps: dict[str, Stamp] = {}     # each file's stamp at hash time, after wait()
        self._thread = threading.Thread(target=self._run, args=(art, list(files)), daemon=True,
                                        name="edge-verify")
        self._thread.start()

    def _run(self, art, files):
        import time

        t0 = time.perf_counter()
        try:
            if files:
                self.stamps = verify_files(art, files)
        except BaseException as exc:  # handed to wait()
            self._error = exc
        self._ms = (time.perf_counter() - t0) * 1000

    def wait(self) -> float:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._ms


def tree_files(root: Path, rel: str) -> list[str]:
    """Every regular file under the directory ``rel`` of ``root`` (artifact-relative posix
    paths, sorted), for package directories such as a Core ML ``.mlpackage``. Refuses
    symlinks anywhere inside and anything that is neither a file nor a directory."""
    base = safe_relpath(Path(root), rel)
    if base.is_symlink() or not base.is_dir():
        raise ArtifactError("package is not a directory", file=rel, code=ec.ARTIFACT_FILE_INVALID)
    out = []
    for dirpath, dirnames, filenames in os.walk(base, followlinks=False):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            inner = f"{rel}/{p.relative_to(base).as_posix()}"
            if p.is_symlink():
                raise ArtifactError("symlink inside a package directory", file=inner, code=ec.ARTIFACT_PATH_ESCAPES)
            if p.is_file():
                out.append(inner)
            elif not p.is_dir():
                raise ArtifactError("not a regular file", file=inner, code=ec.ARTIFACT_FILE_INVALID)
    return sorted(out)


class ArtifactWriter(Record):
    """Builds an artifact directory: add files, then write the manifest."""

    root: Path
    files: dict

    def __init__(self, root: str | os.PathLike, files: dict | None = None) -> None:
        self.root = Path(root)
        self.files = {} if files is None else files
        self.root.mkdir(parents=True, exist_ok=True)

    def add_file(self, rel: str, src: str | os.PathLike | None = None, data: bytes | None = None) -> str:
        dst = safe_relpath(self.root, rel)
        dst.parent.mkdir(parents=True, exist_ok=True)
        if data is not None:
            dst.write_bytes(data)
        elif src is not None:
            if Path(src).resolve() != dst.resolve():
                import shutil      # here: not on load()'s path (bz2/lzma, ~3 ms of start)

                shutil.copyfile(src, dst)
        elif not dst.is_file():
            raise FileNotFoundError(dst)
        self.files[rel] = {"sha256": sha256_file(dst), "bytes": dst.stat().st_size}
        return rel

    def add_tree(self, rel: str) -> list[str]:
        """Hash every file of the directory ``rel`` (already in place) into the manifest."""
        return [self.add_file(f) for f in tree_files(self.root, rel)]

    def discard(self, rel_dir: str) -> None:
        """Forget and delete every file under the directory ``rel_dir`` (a discarded build)."""
        prefix = rel_dir.rstrip("/") + "/"
        for rel in [r for r in self.files if r.startswith(prefix)]:
            del self.files[rel]
        import shutil

        shutil.rmtree(safe_relpath(self.root, prefix.rstrip("/")), ignore_errors=True)

    def write_manifest(self, data: dict) -> Path:
        data = dict(data)
        data["files"] = dict(sorted(self.files.items()))
        out = self.root / mf.MANIFEST_NAME
        tmp = out.with_suffix(".json.tmp")
        tmp.write_bytes(mf.dumps(data))
        os.replace(tmp, out)
        return out
