"""The server's C fast paths (httptools, uvloop, orjson) and their pure-Python fallbacks agree."""

from __future__ import annotations

import json

import numpy as np
import pytest

from edge_runtime import cli_serve, serve_json
from edge_runtime.errors import DeviceError


@pytest.mark.parametrize("fast", [True, False], ids=["orjson", "json"])
def test_json_both_ways_reads_back_the_same_documents(monkeypatch, fast):
    if not fast:
        monkeypatch.setattr(serve_json, "_orjson", None)
    assert serve_json.backend() == ("orjson" if fast else "json")
    doc = {"model_name": "m", "outputs": [{"name": "s", "data": [0.9999986290931702, 1.2e-06, 3e-11, -0.0]}],
           "parameters": {"ok": False, "n": 2**63 - 1, "text": "naïve\u2603\"quoted\"\n"}}
    out = serve_json.dumps(doc)
    assert isinstance(out, bytes) and b" " not in out                                   # compact
    assert json.loads(out) == doc and serve_json.loads(out) == doc
    assert json.loads(serve_json.dumps({1: "a"})) == {"1": "a"}                        # int keys, as json writes
    assert json.loads(serve_json.dumps({"x": np.float32(0.5)}, default=str)) == {"x": "0.5"}
    with pytest.raises((ValueError, RecursionError)):
        serve_json.loads(b'{"inputs": [')


def test_http_stack_takes_the_fast_paths_when_installed_and_falls_back(monkeypatch):
    have = {"httptools": True, "uvloop": True}
    monkeypatch.setattr(cli_serve, "_installed", lambda name: have[name])
    parser, factory = cli_serve.http_stack("auto", "auto")
    assert parser == "httptools" and factory is not None and factory.__module__.startswith("uvloop")
    assert cli_serve.http_stack("h11", "asyncio") == ("h11", None)
    have.update(httptools=False, uvloop=False)
    assert cli_serve.http_stack("auto", "auto") == ("h11", None)
    for args in (("httptools", "auto"), ("auto", "uvloop")):
        with pytest.raises(DeviceError, match="edge-runtime\\[serve\\]"):
            cli_serve.http_stack(*args)
