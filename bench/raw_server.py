"""A hand-written KServe v2 digits server (bench only, not a product): the floor ``edge-infer serve`` is held to.

The least a server can do for one binary-tensor infer request on the same stack
as ours (uvicorn + httptools + uvloop): a bare ASGI function that reads the
body, takes the first BYTES element (an encoded PNG) past the JSON header,
decodes it with PIL, normalises it as the manifest says, runs the artifact's
``onnx-int8`` bucket on a raw ``onnxruntime.InferenceSession`` (one thread, as
our runtime fits for a sub-ms model), softmax and top-1, and answers
``label``/``class_id``/``score`` as JSON. No limits, no deadline, no metrics,
no error mapping, no checks beyond what a crash would need: what it costs is
what the platform (loopback TCP, the HTTP stack, PIL, ORT) costs on this box.

Usage: python bench/raw_server.py ARTIFACT   (prints ``ready http=HOST:PORT``, serves until SIGTERM)
"""

from __future__ import annotations

import asyncio
import io
import json
import signal
import socket
import sys
from pathlib import Path

import numpy as np


def make_app(art: Path):
    import onnxruntime as ort
    from PIL import Image

    man = json.loads((art / "manifest.json").read_text())
    pre = man["preprocess"]
    variant = next(v for v in man["variants"] if v["target"] == "onnx-int8")
    bucket = variant["buckets"][0]
    labels = (art / man["postprocess"]["labels"]).read_text().splitlines()
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(str(art / bucket["file"]), sess_options=so, providers=["CPUExecutionProvider"])
    name_in, name_out = bucket["inputs"][0]["name"], bucket["outputs"][0]["name"]
    scale, mean, std = np.float32(pre["scale"]), np.float32(pre["mean"][0]), np.float32(pre["std"][0])
    model = man["model"]["name"]

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        chunks, more = [], True
        while more:
            msg = await receive()
            chunks.append(msg.get("body", b""))
            more = msg.get("more_body", False)
        body = b"".join(chunks)
        hl = int(dict(scope["headers"])[b"inference-header-content-length"])
        blob = body[hl:]
        png = blob[4:4 + int.from_bytes(blob[:4], "little")]
        a = np.asarray(Image.open(io.BytesIO(png)).convert("L"))
        x = ((a.astype(np.float32) * scale - mean) / std)[None, None]
        y = sess.run([name_out], {name_in: x})[0].reshape(-1).astype(np.float64)
        e = np.exp(y - y.max())
        p = e / e.sum()
        k = int(p.argmax())
        out = json.dumps({"model_name": model, "model_version": "1", "outputs": [
            {"name": "label", "datatype": "BYTES", "shape": [1], "data": [labels[k]]},
            {"name": "class_id", "datatype": "INT64", "shape": [1], "data": [k]},
            {"name": "score", "datatype": "FP32", "shape": [1], "data": [float(p[k])]}]}).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(out)).encode()), (b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": out})

    return app


async def main(art: Path) -> None:
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(make_app(art), http="httptools", loop="none", log_level="warning", access_log=False,
                            lifespan="off", proxy_headers=False)
    server = uvicorn.Server(config)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: setattr(server, "should_exit", True))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    print(f"ready http=127.0.0.1:{sock.getsockname()[1]}", flush=True)
    await task


if __name__ == "__main__":
    import uvloop

    uvloop.run(main(Path(sys.argv[1])))
