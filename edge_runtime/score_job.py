"""``edge-infer score``'s job record (``OUT.job.json``) and the output it guards: what a job is
(``job_identity``), what differs between two (``job_differences``), the atomic write, and
``prepare_output`` (overwrite, or resume: check the record, count and cut the lines already there).
``shadow`` and the Ray engine use the same."""

from __future__ import annotations

import json
import os
import stat
from datetime import datetime, timezone
from pathlib import Path

from . import error_codes as ec
from .errors import InputError, _json_safe
from .score_inputs import input_fingerprint
from .score_summary import Summary

JOB_SCHEMA = "edge-infer-score-job/1"


def job_path(out) -> Path:
    """The job record beside an output: ``OUT.job.json``."""
    out = Path(out)
    return out.with_name(out.name + ".job.json")


def job_identity(rt, source: dict | None = None, *, deadline_ms: int | None = None) -> dict:
    """This job's record. ``source``: ``{"path", "format", "field", "id_field"}`` (what
    ``read_records`` returns as ``.source``); None when the input is not known."""
    man = rt.artifact.manifest
    inp = None
    if source is not None:
        inp = {"path": str(Path(source["path"]).resolve()), "format": source.get("format"),
               "field": source.get("field"), "id_field": source.get("id_field"),
               **{k: v for k, v in input_fingerprint(source["path"], source.get("format")).items() if k != "format"}}
    from . import __version__

    return {"schema": JOB_SCHEMA, "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "edge_runtime": __version__, "input": inp,
            "artifact": {"path": str(Path(rt.artifact.root).resolve()), "manifest_sha256": man.get("manifest_sha256"),
                         "model": rt.artifact.name, "version": rt.artifact.version},
            "variant": rt.variant["target"], "device": rt.device,
            "options": {"deadline_ms": deadline_ms, "device_options": _json_safe(dict(rt.device_options or {}))}}


_INPUT_KEYS = ("format", "field", "id_field", "kind", "files", "bytes", "sha256")


def _short(v):
    return f"{v[:12]}…" if isinstance(v, str) and len(v) == 64 else json.dumps(v, default=str)


def job_differences(recorded: dict, current: dict) -> tuple[list[str], list[str]]:
    """(differences that change results, warnings) between two job records."""
    diffs, warns = [], []

    def cmp(what, a, b):
        if a != b:
            diffs.append(f"{what} {_short(a)} (the output's) vs {_short(b)} (now)")

    r_in, c_in = recorded.get("input"), current.get("input")
    if r_in is None or c_in is None:
        warns.append("the input could not be checked: the job record of "
                     + ("the output" if r_in is None else "this run") + " does not say which input it reads "
                     "(score() was given records without a source); only the last line's id was checked")
    else:
        for k in _INPUT_KEYS:
            cmp(f"input {k}", r_in.get(k), c_in.get(k))
        if c_in.get("sha256") is None and not diffs:
            warns.append(f"the input {c_in.get('path')} is not a regular file or folder: its content cannot be checked")
    cmp("artifact manifest_sha256", (recorded.get("artifact") or {}).get("manifest_sha256"),
        (current.get("artifact") or {}).get("manifest_sha256"))
    cmp("variant", recorded.get("variant"), current.get("variant"))
    cmp("device", recorded.get("device"), current.get("device"))
    r_opt, c_opt = recorded.get("options") or {}, current.get("options") or {}
    for k in sorted(set(r_opt) | set(c_opt)):
        cmp(k, r_opt.get(k), c_opt.get(k))
    return diffs, warns


def _write_job(path: Path, job: dict) -> None:
    """Atomically: a temporary file, fsync, rename, fsync of the folder."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    data = json.dumps(job, indent=2, ensure_ascii=False, default=str) + "\n"
    with open(tmp, "w", encoding="utf-8", errors="surrogateescape") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    try:
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def _read_job(path: Path, out: Path) -> dict | None:
    if not path.exists():
        return None
    try:
        # surrogateescape: _write_job writes an input path's undecodable byte (in\xe9.txt) as that byte
        job = json.loads(path.read_bytes().decode("utf-8", "surrogateescape"))
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: the job record of {out} does not parse ({exc}); start over with --force",
                         code=ec.SCORE_OUTPUT_CORRUPT) from None
    if not isinstance(job, dict) or job.get("schema") != JOB_SCHEMA:
        raise InputError(f"{path} is not a job record of edge-infer score ({JOB_SCHEMA}); start over with --force",
                         code=ec.SCORE_OUTPUT_CORRUPT)
    return job


def _has_complete_line(out: Path) -> bool:
    with open(out, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 16), b""):
            if b"\n" in block:
                return True
    return False


def check_resume_options(resume: bool, force: bool, out) -> None:
    """``--resume`` continues an output file: never with ``--force`` (which starts it over), never on
    stdout (``-``) or without an output (``None``). ``score``, ``score --engine ray`` and ``shadow``."""
    if resume and force:
        raise InputError("--resume and --force exclude each other: --resume continues the output, --force "
                         "starts it over", code=ec.SCORE_OPTIONS_CONFLICT)
    if resume and (out is None or str(out) == "-"):
        raise InputError("--resume needs an output file (-o OUT): stdout ('-') cannot be resumed",
                         code=ec.SCORE_OPTIONS_CONFLICT)


def output_error(out, exc: OSError) -> InputError:
    """An output path that cannot be created or opened (``-o /proc/nope/x.jsonl``, no permission): the
    caller's option, so an ``InputError`` naming the path (exit 2), not the bare ``OSError``."""
    return InputError(f"cannot write the output {out}: {exc.strerror or exc}", code=ec.INPUT_INVALID, path=str(out))


def _not_regular(path: Path) -> str | None:
    """Why ``path`` may not be written, truncated or removed as an output (a device, a FIFO, a folder,
    a socket, a dangling link: ``--force`` would delete it, a write would block or go elsewhere);
    None when it is a regular file (through a link) or absent."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):     # absent (creating it says why it cannot be)
        return "a link to nothing" if os.path.islink(path) else None
    except OSError as exc:
        return f"not readable ({exc.strerror or exc})"
    if stat.S_ISREG(mode):
        return None
    return "a folder" if stat.S_ISDIR(mode) else "not a regular file (a device, a FIFO or a socket)"


def _same_file(a, b) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def check_output(out: Path, job: dict | None = None) -> None:
    """Refuse (``InputError``, exit 2, nothing touched) an output, or its job record, that is not a
    regular file, and an output that is the job's input itself (``-o`` the input, a link to it or a
    hard link of it): ``--force`` would delete it, ``--resume`` cut and append to it."""
    if _system_path(out):
        # /dev/stdout is a link to the process's fd: --force unlinked the link itself (as root: gone for
        # every process until a reboot), and the job record was created as /dev/stdout.job.json
        raise InputError(f"the output {out} is under /dev or /proc: score writes a regular file and its job record "
                         "beside it; write to stdout with -o -", code=ec.INPUT_INVALID, path=str(out))
    for path, what in ((out, "the output"), (job_path(out), "the output's job record")):
        why = _not_regular(path)
        if why is not None:
            raise InputError(f"{what} {path} is {why}: score writes a regular file (-o - writes to stdout)",
                             code=ec.INPUT_INVALID, path=str(path))
    inp = (job or {}).get("input") or {}
    src = inp.get("path")
    art = ((job or {}).get("artifact") or {}).get("path")
    for path, what in ((out, "the output"), (job_path(out), "the output's job record")):
        if src is not None and _same_file(path, src):
            raise InputError(f"{what} {path} is the input {src}: writing it would destroy the input; choose "
                             f"another -o", code=ec.INPUT_INVALID, path=str(path))
        why = _inside(path, art, src if inp.get("kind") == "folder" else None)
        if why is not None:
            raise InputError(f"{what} {path} is {why}; choose another -o", code=ec.INPUT_INVALID, path=str(path))


def _system_path(path: Path) -> bool:
    """Whether ``path`` (as given, or in its folder resolved) is under ``/proc``, or ``/dev`` other than
    the ``/dev/shm`` tmpfs (a regular place for files)."""
    here = Path(os.path.abspath(path))
    for p in (here, Path(os.path.realpath(here.parent)) / here.name):
        if p.parts[1:2] == ("proc",) or (p.parts[1:2] == ("dev",) and p.parts[2:3] != ("shm",)):
            return True
    return False


def _inside(path: Path, artifact: str | None, folder: str | None) -> str | None:
    """Why ``path`` may not be written: inside the artifact (``--force`` would delete its
    ``manifest.json`` or a model file, a new file changes the folder it was sealed in), or an image the
    input folder's walk would read as an input (one overwritten, or one more record than the job's)."""
    from .score_images import IMAGE_SUFFIXES

    real = Path(os.path.realpath(path))
    if artifact is not None and real.is_relative_to(os.path.realpath(artifact)):
        return f"inside the artifact {artifact}: score never writes in the model it runs"
    if folder is not None and real.suffix.lower() in IMAGE_SUFFIXES and real.is_relative_to(os.path.realpath(folder)):
        return f"an image in the input folder {folder}: it would be read (or overwritten) as an input"
    return None


def check_stream(stream, source: dict | None, artifacts=()) -> None:
    """Refuse (``input_invalid``, nothing written) a ``-o -`` whose stdout is the input file itself
    (``score IN -o - >> IN``): each line written would be read as one more input, a run without end
    filling the disk; or a file of an artifact run (``>> ART/manifest.json``: the model it runs, sealed,
    changed under it). A stream with no descriptor (a test's buffer), or not a regular file, is fine."""
    try:
        here = os.fstat(stream.fileno())
    except (AttributeError, OSError, ValueError):     # io.UnsupportedOperation is an OSError and a ValueError
        return
    if not stat.S_ISREG(here.st_mode):
        return
    src = (source or {}).get("path")
    try:
        there = os.stat(src) if src is not None else None
    except OSError:
        there = None
    if there is not None and (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino):
        raise InputError(f"stdout is the input {src} (-o - >> {src}?): every line written would be read as one more "
                         f"input; write to another file", code=ec.INPUT_INVALID, path=str(src))
    for art in artifacts:
        for root, _, names in os.walk(art):
            for name in names:
                try:
                    st = os.stat(os.path.join(root, name))
                except OSError:
                    continue
                if (st.st_dev, st.st_ino) == (here.st_dev, here.st_ino):
                    raise InputError(f"stdout is {os.path.join(root, name)}, a file of the artifact {art}: score "
                                     "never writes in the model it runs; write to another file",
                                     code=ec.INPUT_INVALID, path=str(art))


def overwrite(out: Path, force: bool, job: dict | None = None) -> None:
    """Remove an existing ``out`` (``--force``), or refuse it: it is continued with ``--resume`` only.
    Never anything but a regular file that is not the input (``check_output``)."""
    check_output(out, job)
    if not force:
        raise InputError(f"{out} exists: pass --resume to continue it or --force to overwrite",
                         code=ec.SCORE_OUTPUT_EXISTS)
    try:
        out.unlink()
    except OSError as exc:
        raise output_error(out, exc) from None


def prepare_output(out: Path, resume: bool, force: bool, summary: Summary, job: dict | None = None) -> int:
    """Make ``out`` ready to append; return how many inputs it already holds. ``out`` and its job
    record must be regular files or absent, and not the input (``check_output``)."""
    check_output(out, job)
    try:
        return _prepare_output(out, resume, force, summary, job)
    except OSError as exc:
        raise output_error(out, exc) from None


def _prepare_output(out: Path, resume: bool, force: bool, summary: Summary, job: dict | None) -> int:
    if not out.exists():
        return 0
    if not resume:
        overwrite(out, force, job)
        job_path(out).unlink(missing_ok=True)
        return 0
    recorded = _read_job(job_path(out), out)
    if recorded is None:
        if _has_complete_line(out):
            raise InputError(f"{out} has no job record ({job_path(out).name}): it was written before job records "
                             f"existed or not by edge-infer score, so nothing says it belongs to this job; start over "
                             f"with --force", code=ec.SCORE_RESUME_UNVERIFIABLE)
    elif job is not None:
        diffs, warns = job_differences(recorded, job)
        if diffs:
            raise InputError(f"{out} was written by another job, not resumed: " + "; ".join(diffs)
                             + ". Resume with the same input, artifact, device and options, or --force to start over",
                             code=ec.SCORE_OUTPUT_MISMATCH)
        summary.warnings += warns
    with open(out, "rb+") as fh:
        data_end = fh.seek(0, os.SEEK_END)
        # the partial last line (if any) is cut: it is re-scored
        keep, last = 0, None
        fh.seek(0)
        for raw in iter(fh.readline, b""):
            if not raw.endswith(b"\n"):
                break
            try:
                line = json.loads(raw)
            except ValueError:
                raise InputError(f"{out}: line {summary.total + 1} is not JSON; not an output of this command",
                                 code=ec.SCORE_OUTPUT_CORRUPT) from None
            if not isinstance(line, dict) or line.get("index") != summary.total:
                raise InputError(f"{out}: line {summary.total + 1} has index {line.get('index') if isinstance(line, dict) else '?'}"
                                 f", expected {summary.total}", code=ec.SCORE_OUTPUT_CORRUPT)
            summary.count(line)
            keep += len(raw)
            last = line
        if keep < data_end:
            fh.truncate(keep)
    summary.resumed_from = summary.total
    summary.last_id = None if last is None else last.get("id")
    summary.last_line = None if last is None else last.get("line")
    return summary.total
