"""``edge-infer score --engine ray``: the same lines as local score, every input exactly once.

One local Ray per module (object store 200 MB, 4 logical CPUs on the 2-core box so a
killed driver's actors cannot starve the next run), 2 actors of 1 CPU each. Inputs:
1,000 of digits-cnn's held-out images (repeated) named in a JSONL, plus three bad
records (not JSON, no field, not an image).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ray = pytest.importorskip("ray")

ROOT = Path(__file__).resolve().parents[1]
N_GOOD = 1000


@pytest.fixture(scope="module")
def ray_cluster():
    ray.init(address="local", num_cpus=4, object_store_memory=200_000_000, include_dashboard=False,
             logging_level="WARNING", log_to_driver=False)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ray-inputs")
    images = sorted((ROOT / "models" / "zoo" / "digits-cnn" / "held_out").glob("*/*.png"))
    assert images
    lines = [json.dumps({"id": f"r{i}", "image": str(images[i % len(images)])}) for i in range(N_GOOD)]
    lines[10:10] = ["not json", json.dumps({"id": "no-field"}), json.dumps({"id": "not-image", "image": __file__})]
    path = folder / "inputs.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def local_lines(digits_artifact, inputs, tmp_path_factory):
    from edge_runtime.runtime import load
    from edge_runtime.score import score
    from edge_runtime.score_inputs import read_records

    out = tmp_path_factory.mktemp("ray-local") / "local.jsonl"
    with load(digits_artifact) as rt:
        score(rt, read_records(inputs, field="image"), out, batch_size=16)
    return _normal(out)


def _normal(path) -> list[dict]:
    """The output's lines without what differs run to run (latency, trace id)."""
    lines = []
    for raw in Path(path).read_text().splitlines():
        line = json.loads(raw)
        for k in ("latency_ms", "trace_id"):
            (line.get("result") or {}).pop(k, None)
        lines.append(line)
    return lines


def _exactly_once(path, expected: list[dict]) -> None:
    got = _normal(path)
    assert [g["index"] for g in got] == list(range(len(expected))), "an index missing, repeated or out of order"
    assert [g["id"] for g in got] == [e["id"] for e in expected]
    assert got == expected


def _descends_from(pid: int, ancestor: int) -> bool:
    for _ in range(20):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return False
        pid = int(next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:")))
        if pid == ancestor:
            return True
        if pid <= 1:
            return False
    return False


def _scorer_pids() -> list[int]:
    """This test process's EdgeScorer actors (Ray names their processes after the class)."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes()
        except OSError:
            continue
        if b"MapBatches(EdgeScorer)" in cmd and _descends_from(int(d.name), os.getpid()):
            pids.append(int(d.name))
    return pids


def test_ray_lines_equal_local_lines(ray_cluster, digits_artifact, inputs, local_lines, tmp_path):
    from edge_runtime.score_ray import score_ray

    out = tmp_path / "ray.jsonl"
    summary, info = score_ray(digits_artifact, inputs, out, field="image", batch_size=16, actors=2)
    _exactly_once(out, local_lines)
    assert (summary.total, summary.ok, summary.rejected) == (N_GOOD + 3, N_GOOD, 3)
    job = json.loads((tmp_path / "ray.jsonl.job.json").read_text())
    assert job["engine"] == "ray" and job["artifact"]["manifest_sha256"]
    assert info["actors"] == 2 and info["device"].startswith("onnxruntime")


def test_parquet_in_and_out(ray_cluster, digits_artifact, inputs, local_lines, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from edge_runtime.score_ray import score_ray

    rows = [json.loads(x) for x in inputs.read_text().splitlines()[:40] if x.startswith("{")]
    rows = [r for r in rows if "image" in r and r["image"].endswith(".png")][:32]
    table = pa.table({"id": [r["id"] for r in rows], "image": [Path(r["image"]).read_bytes() for r in rows]})
    pq.write_table(table, tmp_path / "in.parquet")
    summary, _ = score_ray(digits_artifact, tmp_path / "in.parquet", tmp_path / "out.parquet", field="image",
                           batch_size=8, actors=2)
    back = pq.read_table(tmp_path / "out.parquet").to_pylist()
    assert summary.ok == len(rows) == len(back)
    by_id = {line["id"]: line for line in local_lines}
    for row in back:
        assert row["ok"] and json.loads(row["result"])["prediction"] == by_id[row["id"]]["result"]["prediction"]


def test_killed_actor_loses_and_repeats_nothing(ray_cluster, digits_artifact, inputs, local_lines, tmp_path):
    from edge_runtime.score_ray import score_ray

    killed: list = []

    def kill_one(done: int) -> None:
        if killed:
            return
        pids = _scorer_pids()
        assert pids, "no EdgeScorer actor process found"
        os.kill(pids[0], signal.SIGKILL)
        killed.append((pids[0], done))

    out = tmp_path / "ray.jsonl"
    summary, info = score_ray(digits_artifact, inputs, out, field="image", batch_size=8, actors=2,
                              on_progress=kill_one)
    assert killed and killed[0][1] < N_GOOD, "the actor was not killed mid-run"
    _exactly_once(out, local_lines)
    assert summary.total == N_GOOD + 3


def _cli(*args) -> list[str]:
    return [sys.executable, "-m", "edge_runtime", "score", *map(str, args)]


def test_killed_driver_resumes_exactly_once(ray_cluster, digits_artifact, inputs, local_lines, tmp_path):
    out = tmp_path / "ray.jsonl"
    args = (digits_artifact, inputs, "-o", out, "--engine", "ray", "--address", ray_cluster, "--actors", 2,
            "--batch-size", 8, "--quiet")
    proc = subprocess.Popen(_cli(*args), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if out.exists() and out.read_bytes().count(b"\n") >= 30:
                break
            time.sleep(0.01)
        assert proc.poll() is None, f"the driver ended before it was killed: {proc.stderr.read().decode()[-2000:]}"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(30)
    written = out.read_bytes().count(b"\n")
    assert 0 < written < N_GOOD + 3
    done = subprocess.run(_cli(*args, "--resume", "--json"), capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["resumed_from"] >= 30 and report["total"] == N_GOOD + 3
    _exactly_once(out, local_lines)


def test_a_corrupted_copy_is_refused_with_the_file_named(ray_cluster, digits_artifact, tmp_path):
    from edge_runtime.artifact import load_artifact
    from edge_runtime.errors import ArtifactError
    from edge_runtime.ray import EdgeScorer
    from edge_runtime.score_ray import score_ray

    copy = tmp_path / "copy"
    shutil.copytree(digits_artifact, copy)
    manifest = load_artifact(digits_artifact).manifest
    victim = next(f for f in sorted(manifest["files"]) if f.endswith(".onnx"))
    data = bytearray((copy / victim).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (copy / victim).write_bytes(bytes(data))

    # a node whose copy differs: its actor stays up and fails every row, naming the file
    ds = ray.data.from_items([{"index": i, "meta": json.dumps({"id": f"r{i}", "line": i + 1, "value": [0] * 64,
                                                                "error": None})} for i in range(6)])
    rows = ds.map_batches(EdgeScorer, fn_constructor_kwargs={"artifact": str(copy),
                                                             "expect_seal": manifest["manifest_sha256"]},
                          compute=ray.data.ActorPoolStrategy(size=1), num_cpus=1, batch_size=3).take_all()
    assert len(rows) == 6
    for row in rows:
        line = json.loads(row["text"])
        assert not line["ok"] and line["error"]["type"] == "ArtifactError"
        assert victim in line["error"]["message"] and line["error"]["code"] == "artifact_hash_mismatch"

    # another valid version (its own seal) is refused too: never scored with
    scorer = EdgeScorer(str(digits_artifact), expect_seal="0" * 64, verify=False, warm=False)
    assert scorer.load_error is not None and scorer.load_error.code == "artifact_copy_differs"
    assert "manifest.json" in scorer.load_error.message

    # the driver's own copy corrupt: refused before Ray runs anything
    with pytest.raises(ArtifactError, match=victim.replace(".", r"\.")):
        score_ray(copy, tmp_path / "none.jsonl", tmp_path / "out.jsonl")


def test_the_writer_writes_each_index_once_in_order(tmp_path):
    """A retried task's repeat is dropped, an early block waits: deterministic, no Ray needed."""
    from edge_runtime.score import Summary
    from edge_runtime.score_ray import OrderedWriter

    def text(i):
        return json.dumps({"index": i, "id": f"r{i}", "line": i + 1, "ok": True, "result": {"latency_ms": 1.0}})

    summary = Summary()
    with open(tmp_path / "out.jsonl", "ab") as fh:
        w = OrderedWriter(fh, 2, summary, owned=True)
        w.add([4, 5], [text(4), text(5)])          # early: waits for 2 and 3
        w.add([0, 1, 2], [text(0), text(1), text(2)])    # 0, 1 were written before the resume
        w.add([2, 3], [text(2), text(3)])          # a retried block: 2 again
        w.add([5, 6], [text(5), text(6)])
    got = [json.loads(x)["index"] for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert got == [2, 3, 4, 5, 6] and w.duplicates == 4 and summary.scored == 5


def test_ray_batch_size_is_measured_unless_given(digits_artifact, make_artifact):
    """Without --batch-size, a Ray batch holds ~RAY_BATCH_MS of model time measured on the warm-up
    sample (digits: far more than 32 items), within the bounds; a task with no sample keeps 32."""
    import edge_runtime as er
    from edge_runtime.score_ray import RAY_BATCH_MAX, RAY_BATCH_MIN, RAY_BATCH_MS, auto_batch_size

    with er.load(digits_artifact, device="onnxruntime", warmup=False) as rt:
        size, why = auto_batch_size(rt)
        assert RAY_BATCH_MIN < size <= RAY_BATCH_MAX and why.startswith("measured"), (size, why)
        per_item = float(why.split()[1])
        want = RAY_BATCH_MS / per_item                                  # per_item is rounded in the text
        assert size in (RAY_BATCH_MIN, RAY_BATCH_MAX) or abs(size - want) <= 0.01 * want + 1, (size, want)
        assert rt.metrics()["latency_seconds"]                        # it ran the model (not a guess)
    with er.load(make_artifact("tensors"), device="fake") as rt:
        assert auto_batch_size(rt) == (RAY_BATCH_MIN, "default (the task has no sample to time)")


def test_ray_client_address_is_refused_with_the_way_that_works(tmp_path):
    """Ray Data cannot run through Ray Client (ray://): a typed refusal naming `ray job submit`, before
    anything is read, written or started."""
    from edge_runtime.errors import InputError
    from edge_runtime.score_ray import score_ray

    with pytest.raises(InputError) as e:
        score_ray(tmp_path / "no-artifact", tmp_path / "in.jsonl", tmp_path / "out.jsonl", address="ray://head:10001")
    assert e.value.code == "input_invalid" and "ray job submit" in e.value.message
    assert not (tmp_path / "out.jsonl").exists()
