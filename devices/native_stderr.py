"""LiteRT's native INFO lines kept off the process's stderr (``quiet_native_stderr``), for the
``tflite`` and ``edgetpu`` backends: fd 2 redirected under a process-wide lock while an interpreter
allocates, what else was written meanwhile replayed to the real stderr."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading

log = logging.getLogger("edge_runtime.tflite")


# LiteRT's native code writes this on fd 2 when an interpreter allocates its tensors;
# no environment variable turns it off (TF_CPP_MIN_LOG_LEVEL, TFLITE_LOG_LEVEL do not)
_NATIVE_NOISE = {b"INFO: Created TensorFlow Lite XNNPACK delegate for CPU.",
                 b"INFO: Initialized TensorFlow Lite runtime."}
_FD2_LOCK = threading.RLock()     # re-entrant: a nested block redirects into the outer one


def _fd2_lock_after_fork() -> None:
    """A forked child gets a fresh lock: one another thread held at the fork is never released there."""
    global _FD2_LOCK
    _FD2_LOCK = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_fd2_lock_after_fork)


@contextlib.contextmanager
def quiet_native_stderr():
    """Drop LiteRT's INFO lines from the process's stderr while the block runs.

    fd 2 is pointed at a temporary file (under a process-wide lock, so two threads
    making interpreters never interleave their redirects) and restored when the block
    ends, exception or not; what was written meanwhile, by the native code or by any
    other thread, is then written to the real stderr, less the known INFO lines (logged
    at DEBUG instead). Native errors therefore still reach stderr, only later. Without a
    usable fd 2 or temporary directory the block runs unredirected."""
    with _FD2_LOCK:
        saved: int | None = None
        tmp = None
        try:
            tmp = _scratch_file()
            saved = os.dup(2)
        except OSError:
            if tmp is not None:
                tmp.close()
            tmp = None
        if tmp is None or saved is None:    # saved is set whenever tmp is
            yield
            return
        _flush_stderr()
        try:
            os.dup2(tmp.fileno(), 2)
            try:
                yield
            finally:
                _flush_stderr()
                os.dup2(saved, 2)
        finally:
            os.close(saved)
            try:
                tmp.seek(0)
                captured = tmp.read()
            finally:
                tmp.close()
            _replay(captured)


def _scratch_file():
    """An anonymous read/write file: a memfd where Linux has one (no ``tempfile`` import, whose
    ``random``/``shutil`` cost 3.4 ms of every process start on LiteRT, 2-core AMD EPYC with AVX-512 VNNI),
    else ``tempfile.TemporaryFile()``. ``OSError`` when neither can be made."""
    memfd = getattr(os, "memfd_create", None)
    if memfd is not None:
        try:
            return open(memfd("edge-infer-stderr", getattr(os, "MFD_CLOEXEC", 0)), "w+b")
        except OSError:
            pass
    import tempfile

    return tempfile.TemporaryFile()


def _flush_stderr() -> None:
    try:
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 - a closed or replaced sys.stderr
        pass


def _replay(captured: bytes) -> None:
    keep = []
    for line in captured.splitlines(keepends=True):
        if line.strip() in _NATIVE_NOISE:
            log.debug("%s", line.strip().decode("utf-8", "replace"))
        else:
            keep.append(line)
    data = b"".join(keep)
    while data:
        try:
            data = data[os.write(2, data):]
        except OSError:
            return
