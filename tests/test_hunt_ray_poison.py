"""``score --engine ray`` on an input that kills its actor's process every time (a native crash in the
backend on one record): Ray Data's actor pool restarted the actor and retried the task *without end*
(``max_restarts=-1``, ``max_task_retries=-1`` by default), so the job never ended. Now:

- with Ray's key-value store (``ray_poison``'s marks), that record's line is ``backend_crashed`` and
  every other record is scored: the job ends, with one failed line;
- without it (``POISON_GUARD`` off, as with a Ray lacking the store), a block is retried
  ``RAY_TASK_RETRIES`` times, then the job ends typed (``inference_failed``), the output keeps every
  line before the crash, in order, and the message names the first record not written.

One local Ray (2 CPUs), one actor, the fake backend's ``segfault_if_first`` option (the process dies of
SIGSEGV on an input whose first value is the poison)."""

from __future__ import annotations

import json
import threading

import pytest

pytestmark = pytest.mark.slow
ray = pytest.importorskip("ray")

from test_ray_hunt import ray_cluster  # noqa: E402,F401 - one local Ray for the module (2 CPUs)

POISON = 7


def _job(tmp_path):
    """score_ray on 12 tensors records, the 8th (index 7) the poison; (result or error, the output's lines)."""
    from factories import make_artifact

    from edge_runtime.score_ray import score_ray

    art = make_artifact(tmp_path / "art", "tensors")
    rows = [{"id": f"r{i}", "inputs": {"x": [[float(i), 0, 0, 0]], "k": [[0, 0]]}} for i in range(12)]
    rows[POISON]["inputs"]["x"][0][0] = 666.0
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out.jsonl"
    box: dict = {}

    def job():
        try:
            box["result"] = score_ray(art, inp, out, batch_size=2, actors=1, verify=False,
                                      device_options={"segfault_if_first": 666.0})
        except BaseException as exc:      # noqa: BLE001 - handed to the test's thread
            box["error"] = exc

    t = threading.Thread(target=job, daemon=True)
    t.start()
    t.join(150)
    assert not t.is_alive(), "score --engine ray never ended on an input that kills its actor every time"
    return box, [json.loads(x) for x in out.read_text().splitlines()]


def test_a_record_that_kills_every_actor_gets_its_own_line_and_the_job_finishes(ray_cluster, tmp_path):
    from edge_runtime import error_codes as ec
    from edge_runtime.ray_poison import NAMESPACE, POISON_DEATHS

    box, lines = _job(tmp_path)
    assert "error" not in box, box
    summary, info = box["result"]
    assert [x["index"] for x in lines] == list(range(12))
    assert [x["ok"] for x in lines] == [i != POISON for i in range(12)]
    err = lines[POISON]["error"]
    assert err["code"] == ec.BACKEND_CRASHED and f"died on this record {POISON_DEATHS} times" in err["message"]
    assert summary.to_dict()["failed"] == 1 and summary.to_dict()["ok"] == 11
    from ray.experimental import internal_kv

    assert internal_kv._internal_kv_list("score-", namespace=NAMESPACE) == [], "the job's marks were left"


def test_without_the_marks_the_job_ends_typed_not_never(ray_cluster, tmp_path, monkeypatch):
    from edge_runtime import error_codes as ec
    from edge_runtime import ray_poison, score_ray
    from edge_runtime.errors import InferenceRuntimeError

    monkeypatch.setattr(score_ray, "POISON_GUARD", False)
    monkeypatch.setattr(ray_poison, "RAY_TASK_RETRIES", 2)      # the driver's bound; fewer actor restarts
    RAY_TASK_RETRIES = 2
    box, lines = _job(tmp_path)
    err = box.get("error")
    assert isinstance(err, InferenceRuntimeError) and err.code == ec.INFERENCE_FAILED, box
    n = len(lines)          # the blocks run out of order: which ones were written before the end varies
    assert n <= POISON and [x["index"] for x in lines] == list(range(n)) and all(x["ok"] for x in lines), lines
    msg = err.message
    assert f"{RAY_TASK_RETRIES + 1} times" in msg and f"index {n} (id 'r{n}', input line {n + 1})" in msg, msg
    assert err.details["lines_written"] == n and "--resume" in msg
