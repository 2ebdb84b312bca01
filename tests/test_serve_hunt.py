"""``edge-infer serve`` answers a request naming no version with the latest one (2026-12 bug hunt).

Before 2026-12-07 the "latest" version of a model was the one whose artifact loaded last: with
``--repository DIR`` the folder sorting last by name. A repository holding ``a-new`` (version 10)
and ``b-old`` (version 9) answered every versionless request (tritonclient's default, and
``/v2/models/{m}/infer``) with version 9, a 200 a client would trust, and the model metadata listed
one version. Now versions order as numbers (Triton's default policy: the highest); where a name has
several versions that do not (``beta``, ``rc``), a versionless request is a 400
``serve_request_malformed`` asking for a version, never an arbitrary one. An output requested twice
is refused too (before, both copies came back with the parameters given on either). The models are the
tiny fake-backend artifacts of ``factories``: no real model runs.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from edge_runtime import error_codes as ec
from edge_runtime import manifest as mf
from edge_runtime.serve_types import InferRequest, ServeError, Tensor

NAME = "tiny-text-classification"


def _versioned(art: Path, version: str) -> Path:
    m = json.loads((art / "manifest.json").read_text())
    m["model"]["version"] = version
    (art / "manifest.json").write_bytes(mf.dumps(m))
    return art


@pytest.fixture
def repo_core(tmp_path):
    """A ``ServeCore`` over a model repository whose folders (in name order) hold ``versions``."""
    from factories import make_artifact

    from edge_runtime.serve_core import ServeCore, artifacts_in

    made = []

    def build(*versions: str):
        root = tmp_path / f"repo{len(made)}"
        for i, v in enumerate(versions):
            _versioned(make_artifact(root / f"{chr(97 + i)}-model", seed=i), v)
        core = ServeCore(artifacts_in(root), verify=False)
        core.load_all()
        made.append(core)
        return core

    yield build
    for c in made:
        c.close()


def _infer(core, version: str | None):
    req = InferRequest(model=NAME, version=version, inputs=[Tensor("text", "BYTES", [1], [b"good film"])])
    return asyncio.run(core.infer(req))


@pytest.mark.parametrize("versions, latest", [(("10", "9"), "10"), (("2", "1"), "2"), (("1.10", "1.9"), "1.10"),
                                              (("1", "3", "2"), "3")])
def test_versionless_request_gets_the_highest_version(repo_core, versions, latest):
    core = repo_core(*versions)
    resp = _infer(core, None)
    assert resp.model_version == latest and resp.parameters["model_version"] == latest
    assert _infer(core, "").model_version == latest
    for v in versions:                       # a named version is still that one
        assert _infer(core, v).model_version == v
    md = core.model_metadata(NAME, None)
    assert md["versions"][-1] == latest and sorted(md["versions"]) == sorted(versions)
    assert core.model_metadata(NAME, versions[-1])["versions"] == md["versions"]
    assert core.model_ready(NAME, None)


@pytest.mark.parametrize("versions", [("rc", "beta"), ("01", "1")])
def test_versions_that_do_not_order_need_a_version(repo_core, versions):
    core = repo_core(*versions)
    with pytest.raises(ServeError) as e:
        _infer(core, None)
    assert e.value.status == "bad_request" and e.value.code == ec.SERVE_REQUEST_MALFORMED
    assert ", ".join(sorted(versions)) in str(e.value)
    with pytest.raises(ServeError):
        core.model_metadata(NAME, None)
    for v in versions:
        assert _infer(core, v).model_version == v
    core.count_refused(NAME, None, "unauthorized", 0)       # a front end's refusal keeps the served name
    assert f'edge_serve_requests_total{{model="{NAME}",status="unauthorized"}} 1' in core.metrics_text()


def test_an_output_requested_twice_is_refused(repo_core):
    """Before: ``score`` asked plain and again with ``classification`` got two ``score`` tensors, both
    the classification's BYTES (the parameters are kept per name), a 200; tritonclient's ``as_numpy``
    gave the first. Now a 400 before any model work, as Triton refuses a repeated output."""
    from edge_runtime.serve_wire import decode_request

    core = repo_core("1")
    body = json.dumps({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["good film"]}],
                       "outputs": [{"name": "score"},
                                   {"name": "score", "parameters": {"classification": 2}}]}).encode()
    req, _, _ = decode_request(body, None, NAME, None)
    with pytest.raises(ServeError) as e:
        asyncio.run(core.infer(req))
    assert e.value.status == "bad_request" and e.value.code == ec.SERVE_REQUEST_MALFORMED
    assert "'score' requested twice" in str(e.value)
    for m in core.models.values():
        snap = m.rt.metrics()
        assert snap["errors"] == [] and sum(h["count"] for h in snap["latency_seconds"].values()) == 0


def test_a_repository_subfolder_without_a_manifest_is_said_not_skipped_in_silence(tmp_path, caplog):
    """A Triton-style ``DIR/name/1/manifest.json`` layout served nothing of that model while readiness
    turned true for the others, without a word."""
    import logging

    from edge_runtime.serve_model import artifacts_in

    (tmp_path / "good").mkdir()
    (tmp_path / "good" / "manifest.json").write_text("{}")
    (tmp_path / "triton-style" / "1").mkdir(parents=True)
    (tmp_path / ".hidden").mkdir()
    with caplog.at_level(logging.WARNING, logger="edge_runtime.serve"):
        assert [p.name for p in artifacts_in(tmp_path)] == ["good"]
    said = [r.getMessage() for r in caplog.records if "without a manifest.json" in r.getMessage()]
    assert len(said) == 1 and "triton-style/" in said[0] and ".hidden" not in said[0]
