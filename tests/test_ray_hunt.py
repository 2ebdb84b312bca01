"""``score --engine ray`` against local ``score`` on the inputs that broke it: an artifact without a
probe set, an input's own ``{"$b64": ...}`` object, undecodable ids into Parquet, Parquet ids of
odd types, an actor no CPU of the local Ray can hold, and what ran where.

One local Ray for the module (2 CPUs, 200 MB object store), 1 actor per run, the fake backend's
tiny artifacts: the whole module runs in well under a minute.
"""

from __future__ import annotations

import base64
import json
import threading
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.slow
ray = pytest.importorskip("ray")

from test_ray_score import _normal  # noqa: E402 - the output's lines without latency and trace id


@pytest.fixture(scope="module")
def ray_cluster():
    ray.init(address="local", num_cpus=2, object_store_memory=200_000_000, include_dashboard=False,
             logging_level="WARNING", log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def arts(tmp_path_factory):
    from factories import make_artifact

    root = tmp_path_factory.mktemp("ray-hunt-arts")
    return {"text": make_artifact(root / "text", "text-classification", probe=4),
            "image": make_artifact(root / "image", "image-classification", probe=4),
            "no_probe": make_artifact(root / "no-probe", "text-classification")}


def _both(art, inp: Path, tmp_path, field="text", **kw):
    """(local lines, ray lines, local summary, ray summary, ray info) on the same input."""
    from edge_runtime.runtime import load
    from edge_runtime.score import score
    from edge_runtime.score_inputs import read_records
    from edge_runtime.score_ray import score_ray

    with load(art) as rt:
        s_local = score(rt, read_records(inp, field=field), tmp_path / "local.jsonl", batch_size=4)
    s_ray, info = score_ray(art, inp, tmp_path / "ray.jsonl", field=field, batch_size=4, actors=1, **kw)
    return _normal(tmp_path / "local.jsonl"), _normal(tmp_path / "ray.jsonl"), s_local, s_ray, info


def _counts(s) -> dict:
    d = s.to_dict()
    return {k: d[k] for k in ("total", "ok", "rejected", "failed", "errors", "error_types")}


def test_an_artifact_without_probe_set_scores_as_local(ray_cluster, arts, tmp_path):
    """An imported model has no probe set: local score scores it; the actors refused every row with
    ``probe_missing`` (exit 3, nothing scored). They load it unverified, as ``serve`` does, and say so."""
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"id": f"r{i}", "text": f"hello {i}"}) + "\n" for i in range(5)))
    local, got, s_local, s_ray, info = _both(arts["no_probe"], inp, tmp_path)
    assert got == local and all(line["ok"] for line in got)
    assert _counts(s_ray) == _counts(s_local)
    assert info["ran_on"] and all(w.endswith("fake:cpu verify=none") for w in info["ran_on"])


def test_an_inputs_own_b64_object_is_refused_as_local(ray_cluster, arts, tmp_path):
    """A JSONL value ``{"$b64": "<a PNG>"}`` is an object: local score refuses it (``input_wrong_type``);
    the actors decoded it as image bytes and scored it: a result, exit 0, where local has an error."""
    from factories import png_bytes

    png = base64.b64encode(png_bytes(np.zeros((8, 8), np.uint8))).decode()
    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps({"id": "obj", "image": {"$b64": png}}) + "\n"
                   + json.dumps({"id": "text", "text": {"$b64": "aGVsbG8="}}) + "\n")
    local, got, s_local, s_ray, _ = _both(arts["image"], inp, tmp_path, field="image")
    assert [line["ok"] for line in local] == [False, False]
    assert got == local and _counts(s_ray) == _counts(s_local)


def test_parquet_bytes_still_travel_as_bytes(ray_cluster, arts, tmp_path):
    """The other side of the same change: a binary Parquet cell is still an encoded image."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from edge_runtime.score_ray import score_ray
    from factories import png_bytes

    pq.write_table(pa.table({"id": ["a", "b"], "image": pa.array([png_bytes(np.zeros((8, 8), np.uint8)), b"junk"],
                                                                  pa.large_binary())}), tmp_path / "in.parquet")
    s, _ = score_ray(arts["image"], tmp_path / "in.parquet", tmp_path / "out.jsonl", field="image", batch_size=4,
                     actors=1)
    lines = _normal(tmp_path / "out.jsonl")
    assert [line["ok"] for line in lines] == [True, False] and lines[1]["error"]["code"] == "input_undecodable"


def test_undecodable_ids_reach_a_parquet_output(ray_cluster, arts, tmp_path):
    """A JSONL id with a byte that is not UTF-8 (kept as a lone surrogate, ``input_bad_encoding``) and an
    id ``"\\ud800"``: the JSONL lines write them escaped; the Parquet conversion raised UnicodeEncodeError
    after every line was scored (untyped, exit 1, no output)."""
    import pyarrow.parquet as pq

    from edge_runtime.score_ray import score_ray

    inp = tmp_path / "in.jsonl"
    inp.write_bytes(b'{"id":"\\ud800","text":"hello"}\n{"id":"b\xff","text":"x"}\n{"id":"c","text":"bye"}\n')
    s, _ = score_ray(arts["text"], inp, tmp_path / "out.parquet", field="text", batch_size=4, actors=1)
    rows = pq.read_table(tmp_path / "out.parquet").to_pylist()
    assert [r["index"] for r in rows] == [0, 1, 2] and s.total == 3
    assert [r["id"] for r in rows] == ["\\ud800", "b\\udcff", "c"]
    assert [r["ok"] for r in rows] == [True, False, True] and rows[1]["error_code"] == "input_bad_encoding"


def test_parquet_ids_of_odd_types_are_kept(ray_cluster, arts, tmp_path):
    """A binary id column's ``b"r1"`` was written as ``"\\"b'r1'\\""`` (Python's repr, JSON-quoted), a
    timestamp as a JSON-quoted string: the ids are their text; a null id stays null."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from edge_runtime.score_ray import score_ray

    pq.write_table(pa.table({"id": pa.array([b"r1", None, b"r\xff"], pa.binary()), "text": ["a", "b", None]}),
                   tmp_path / "bin.parquet")
    pq.write_table(pa.table({"id": pa.array([1, 2], pa.timestamp("s")), "text": ["a", "b"]}), tmp_path / "ts.parquet")
    score_ray(arts["text"], tmp_path / "bin.parquet", tmp_path / "bin.jsonl", field="text", batch_size=4, actors=1)
    score_ray(arts["text"], tmp_path / "ts.parquet", tmp_path / "ts.jsonl", field="text", batch_size=4, actors=1)
    assert [line["id"] for line in _normal(tmp_path / "bin.jsonl")] == ["r1", None, "r\udcff"]
    assert [line["id"] for line in _normal(tmp_path / "ts.jsonl")] == ["1970-01-01 00:00:01", "1970-01-01 00:00:02"]


def test_an_actor_no_cpu_can_hold_is_refused_not_waited_for(ray_cluster, arts, tmp_path):
    """``--cpus-per-actor 4`` on a 2-CPU local Ray: Ray Data waited forever for the CPUs, silently (a
    hang). The local Ray cannot grow: a typed refusal naming the CPUs there are."""
    from edge_runtime.errors import InputError
    from edge_runtime.score_ray import score_ray

    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps({"id": "a", "text": "hello"}) + "\n")
    outcome: list = []

    def run():
        try:
            outcome.append(score_ray(arts["text"], inp, tmp_path / "out.jsonl", field="text", actors=1,
                                     cpus_per_actor=4))
        except BaseException as exc:     # noqa: BLE001 - handed to the test thread
            outcome.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(30)
    assert outcome, "score_ray waited 30 s for an actor the local Ray can never start"
    exc = outcome[0]
    assert isinstance(exc, InputError) and exc.code == "input_invalid" and "--cpus-per-actor 4" in exc.message


def test_what_ran_where_and_the_small_cases(ray_cluster, arts, tmp_path):
    """A single record, duplicate ids, over-long and broken CSV rows: the lines and counts are local's;
    ``ran_on`` names the node, the device and the verify of the actors that wrote every line."""
    inp = tmp_path / "in.csv"
    inp.write_bytes(b"id,text\n1,hello\n1,again\n2," + b"x" * 70000 + b'\n3,"never closed\n4,bye\n')
    local, got, s_local, s_ray, info = _both(arts["text"], inp, tmp_path)
    assert got == local and _counts(s_ray) == _counts(s_local)
    assert sum(info["ran_on"].values()) == s_ray.scored == len(got)
    for w in info["ran_on"]:
        assert w.split(" ")[1:] == [info["device"], "verify=passed"] and ":" in w.split(" ")[0], w
    assert not s_ray.warnings

    one = tmp_path / "one" / "in.jsonl"
    one.parent.mkdir()
    one.write_text(json.dumps({"id": "only", "text": "hello"}) + "\n")
    local, got, *_ = _both(arts["text"], one, one.parent)
    assert got == local and len(got) == 1


def test_the_tune_decisions_options_reach_the_actors(ray_cluster, tmp_path):
    """A cached throughput tune decision for this artifact here chose the path with device options (the fake
    backend's ``perturb``, standing for a measured precision): local score and the driver's job record run
    with them; the actors, given the device by name, took no tune decision and ran without them: other
    results than local score's, under a job record naming options they never had."""
    import edge_runtime as er
    from edge_runtime import tune_cache
    from edge_runtime.score_ray import score_ray
    from factories import make_artifact, seal_of

    art = make_artifact(tmp_path / "art", "text-classification", seed=7, probe=4)
    with er.load(art, warmup=False, device="fake") as rt:
        hw = rt.hardware
    d = {"target": "fake", "backend": "fake", "device_options": {"perturb": 5.0}, "why": "measured here (test)"}
    tune_cache.store(seal_of(art), hw, {
        "artifact": str(art), "model": "m", "version": "3", "seal": seal_of(art), "created": "2026-12-07T00:00:00Z",
        "here": {}, "static": {"target": "fake", "backend": "fake"}, "decision": {"throughput": d}, "rows": [],
        "rounds": 1, "probe_samples": 4, "seconds": 0.1})
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"id": f"r{i}", "text": f"hello world {i}"}) + "\n" for i in range(6)))
    with er.load(art, device="fake") as rt:            # a named device: no tune decision, no perturb
        plain = [r.scores for r in rt.infer_batch([f"hello world {i}" for i in range(6)])]
    _, info = score_ray(art, inp, tmp_path / "ray.jsonl", field="text", batch_size=4, actors=1, verify=False)
    job = json.loads((tmp_path / "ray.jsonl.job.json").read_text())
    assert job["options"]["device_options"].get("perturb") == 5.0
    got = [line["result"]["scores"] for line in _normal(tmp_path / "ray.jsonl")]
    assert len(got) == 6 and got != [{k: float(v) for k, v in s.items()} for s in plain], \
        "the actors ran without the tuned options the job record names"


def test_parquet_files_in_subfolders_are_refused_not_skipped(ray_cluster, arts, tmp_path):
    """A folder input with ``part-0.parquet`` and ``more/part-1.parquet`` (a partitioned dataset's
    layout): only the top file was read, exit 0, the subfolder's rows lost without a word."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from edge_runtime.errors import InputError
    from edge_runtime.score_ray import score_ray

    folder = tmp_path / "data"
    (folder / "more").mkdir(parents=True)
    pq.write_table(pa.table({"id": ["a"], "text": ["hello"]}), folder / "part-0.parquet")
    pq.write_table(pa.table({"id": ["b"], "text": ["bye"]}), folder / "more" / "part-1.parquet")
    with pytest.raises(InputError) as e:
        score_ray(arts["text"], folder, tmp_path / "out.jsonl", field="text", batch_size=4, actors=1)
    assert e.value.code == "input_invalid" and "part-1.parquet" in e.value.message
    assert not (tmp_path / "out.jsonl").exists()


def test_the_human_summary_names_what_answered_the_lines(arts, tmp_path):
    """``ray.ran_on`` was in ``--json`` only: the printed summary now says which actor (node, pid,
    device, verify) wrote how many lines."""
    from click.testing import CliRunner

    from edge_runtime.cli import main
    from edge_runtime.cli_score import _human

    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps({"id": "a", "text": "hello"}) + "\n")
    res = CliRunner().invoke(main, ["score", str(arts["text"]), str(inp), "-o", str(tmp_path / "o.jsonl"), "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    data["ray"] = {"actors": 2, "cpus_per_actor": 1.0, "address": "local", "ray_init_s": 1.0, "first_rows_s": 2.0,
                   "duplicates_dropped": 0, "ran_on": {"node1:11 fake:cpu verify=passed": 1}}
    shown: list[str] = []
    _human(data, shown.append)
    assert "ray: lines by actor: node1:11 fake:cpu verify=passed: 1" in shown, shown
