"""Test helpers for the gRPC front end: an in-process server in its own loop thread,
a scripted fake core, and a real ``edge-infer serve`` process."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from edge_runtime.serve_types import InferRequest, InferResponse, ServeError, Tensor


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LoopServer:
    """``start_grpc(core, ...)`` in a daemon thread with its own asyncio loop."""

    def __init__(self, core: Any, **kw: Any):
        self.core = core
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = self.call(self._start(**kw))
        self.port = int(self.server.edge_port)
        self.target = f"127.0.0.1:{self.port}"

    async def _start(self, **kw: Any) -> Any:
        from edge_runtime.serve_grpc import start_grpc

        if hasattr(self.core, "load_all"):
            self.core.load_all()
        return await start_grpc(self.core, "127.0.0.1", 0, **kw)

    def call(self, coro: Any, timeout: float = 120) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.call(self.server.stop(1))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


class FakeCore:
    """A scripted ServeCore: ``infer`` echoes its request, or raises ``self.fail``."""

    def __init__(self) -> None:
        self.live = True
        self.ready = True
        self.fail: ServeError | Exception | None = None
        self.delay_s = 0.0
        self.requests: list[InferRequest] = []
        self.rejections: list[str] = []
        self.cancelled = 0
        self.finished = 0

    def model_ready(self, name: str, version: str | None) -> bool:
        if name != "echo" or version not in (None, "1"):
            raise ServeError("not_found", f"no model {name!r} version {version!r}", "serve_model_not_found")
        return self.ready

    def server_metadata(self) -> dict[str, Any]:
        return {"name": "edge-runtime", "version": "0.0-test", "extensions": ["binary_tensor_data"]}

    def model_metadata(self, name: str, version: str | None) -> dict[str, Any]:
        self.model_ready(name, version)
        return {"name": "echo", "versions": ["1"], "platform": "fake",
                "inputs": [{"name": "x", "datatype": "BYTES", "shape": [-1]}],
                "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 2]}]}

    async def infer(self, req: InferRequest) -> InferResponse:
        self.requests.append(req)
        try:
            return await self._infer(req)
        finally:
            self.finished += 1

    async def _infer(self, req: InferRequest) -> InferResponse:
        if self.delay_s:
            try:
                await asyncio.sleep(self.delay_s)
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        if self.fail is not None:
            raise self.fail
        self.model_ready(req.model, req.version)
        outs = []
        for t in req.inputs:                 # echo: the same tensor back under "<name>_out"
            outs.append(Tensor(t.name + "_out", t.datatype, list(t.shape), t.data))
        return InferResponse("echo", "1", outs, id=req.id,
                             parameters={"prediction": "ok", "n": len(req.inputs), "score": 0.25,
                                         "flag": True, "top_k": [{"index": 1, "score": 0.5}]})

    def count_rejection(self, reason: str) -> None:
        self.rejections.append(reason)


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


class ServeProcess:
    """A real ``edge-infer serve ARTIFACT... --port P --grpc-port G`` on 127.0.0.1."""

    def __init__(self, artifacts: list[Path], *extra: str, ready_timeout: float = 120):
        self.http_port, self.grpc_port = free_port(), free_port()
        cmd = [sys.executable, "-m", "edge_runtime", "serve", *map(str, artifacts), "--host", "127.0.0.1",
               "--port", str(self.http_port), "--grpc-port", str(self.grpc_port), *extra]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.target = f"127.0.0.1:{self.grpc_port}"
        self._out: list[bytes] = []
        threading.Thread(target=self._drain, daemon=True).start()
        self.wait_ready(ready_timeout)

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._out.append(line)

    def output(self) -> str:
        return b"".join(self._out).decode("utf-8", "replace")

    def wait_ready(self, timeout: float) -> None:
        import tritonclient.grpc as tg

        client = tg.InferenceServerClient(self.target)
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"edge-infer serve exited {self.proc.returncode}:\n{self.output()}")
            try:
                if client.is_server_ready(client_timeout=2):
                    client.close()
                    return
            except Exception:
                pass
            time.sleep(0.2)
        self.close()
        raise RuntimeError(f"edge-infer serve not ready in {timeout} s:\n{self.output()}")

    def close(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


def as_list(x: Any) -> list[Any]:
    return list(np.asarray(x).reshape(-1))
