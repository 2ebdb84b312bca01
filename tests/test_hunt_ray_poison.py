"""``score --engine ray`` on an input that kills its actor's process every time (a native crash in the
backend on one record): Ray Data's actor pool restarts the actor and retries the task *without end*
(``max_restarts=-1``, ``max_task_retries=-1`` by default), so the job never ended. Now a block is
retried a bounded number of times (``RAY_TASK_RETRIES``), then the job ends typed
(``inference_failed``), the output keeps every line before the crash, in order, and the message names
the first record not written, where the crash lies.

One local Ray (2 CPUs), one actor, the fake backend's ``segfault_if_first`` option (the process dies of
SIGSEGV on an input whose first value is the poison)."""

from __future__ import annotations

import json
import threading

import pytest

pytestmark = pytest.mark.slow
ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def ray_cluster():
    ray.init(address="local", num_cpus=2, object_store_memory=200_000_000, include_dashboard=False,
             logging_level="WARNING", log_to_driver=False)
    yield
    ray.shutdown()


def test_a_record_that_kills_every_actor_ends_the_job_typed_not_never(ray_cluster, tmp_path):
    from factories import make_artifact

    from edge_runtime import error_codes as ec
    from edge_runtime.errors import InferenceRuntimeError
    from edge_runtime.score_ray import RAY_TASK_RETRIES, score_ray

    art = make_artifact(tmp_path / "art", "tensors")
    rows = [{"id": f"r{i}", "inputs": {"x": [[float(i), 0, 0, 0]], "k": [[0, 0]]}} for i in range(12)]
    rows[7]["inputs"]["x"][0][0] = 666.0
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
    t.join(120)
    assert not t.is_alive(), "score --engine ray never ended on an input that kills its actor every time"
    err = box.get("error")
    assert isinstance(err, InferenceRuntimeError), box
    assert err.code == ec.INFERENCE_FAILED
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    n = len(lines)          # the blocks run out of order: which ones were written before the end varies
    assert n <= 7 and [x["index"] for x in lines] == list(range(n)) and all(x["ok"] for x in lines), lines
    msg = err.message
    assert f"{RAY_TASK_RETRIES + 1} times" in msg and f"index {n} (id 'r{n}', input line {n + 1})" in msg, msg
    assert err.details["lines_written"] == n
    assert "--resume" in msg, msg
