"""A real ``edge-infer serve`` process on 127.0.0.1 with free ports, for the serve tests.

Started with ``--port 0 --grpc-port 0``; the ports come from its ``ready``
line. Every wait is bounded; ``stop()`` sends SIGTERM and returns the exit
code and the rest of stdout; a process left running is killed at exit.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time


class ServerProc:
    def __init__(self, *artifacts, args=(), grpc: bool = False, ready_timeout: float = 240.0, env=None):
        cmd = [sys.executable, "-m", "edge_runtime", "serve", *map(str, artifacts), "--port", "0"]
        cmd += ["--grpc-port", "0"] if grpc else ["--no-grpc"]
        cmd += list(args)
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, **(env or {})})
        self.lines: queue.Queue = queue.Queue()
        self.stderr: list[str] = []
        threading.Thread(target=self._pump, args=(self.proc.stdout, self.lines), daemon=True).start()
        threading.Thread(target=self._collect, daemon=True).start()
        self.ready_line = self._wait_for("ready ", ready_timeout)
        fields = dict(p.split("=", 1) for p in self.ready_line.split()[1:] if "=" in p)
        self.http = fields["http"]
        self.grpc = None if fields.get("grpc", "off") == "off" else fields["grpc"]
        self.port = int(self.http.rsplit(":", 1)[1])

    @staticmethod
    def _pump(stream, q):
        for line in stream:
            q.put(line.rstrip("\n"))
        q.put(None)

    def _collect(self):
        for line in self.proc.stderr:
            self.stderr.append(line)

    def _wait_for(self, prefix: str, timeout: float) -> str:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                line = self.lines.get(timeout=max(0.01, end - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                break
            if line.startswith(prefix):
                return line
        self.kill()
        raise AssertionError(f"serve printed no {prefix!r} line in {timeout} s; rc={self.proc.poll()} "
                             f"stderr: {''.join(self.stderr)[-3000:]}")

    def stop(self, sig=signal.SIGTERM, timeout: float = 60.0) -> tuple[int, str]:
        """Signal it, wait for the exit (bounded); (exit code, its ``stopped`` line)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"serve did not exit within {timeout} s of {sig!r}") from None
        stopped = ""
        while True:
            try:
                line = self.lines.get(timeout=2)
            except queue.Empty:
                break
            if line is None:
                break
            if line.startswith("stopped"):
                stopped = line
        return rc, stopped

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def rss_kb(self) -> int:
        with open(f"/proc/{self.proc.pid}/status") as f:
            return int(re.search(r"VmRSS:\s+(\d+)", f.read())[1])

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        try:
            self.stop(timeout=30)
        finally:
            self.kill()
