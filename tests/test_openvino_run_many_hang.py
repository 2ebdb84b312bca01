"""OpenVINO's batch path never hangs: ``run_many`` started jobs on an ``AsyncInferQueue`` and waited
for them with ``wait_all()`` (and ``start_async``, which waits for an idle job) with no bound, so one
request that never completes (a hung device, driver or plugin) hung ``rt.infer_batch``, ``edge-infer
score`` and serve's batches for ever. Now the watchdog cancels the queue's jobs one item's share of the
budget after the batch deadline; their items are ``TimeoutError`` (``InferenceTimeout`` through the
runtime) and the queue is replaced, so the next batch runs and is right.

The stuck job is a wrapper around the session's real queue: every other item runs on OpenVINO, the
stuck one completes only when it is cancelled after it started, as ``InferRequest.cancel()`` does.
"""

import threading
import time

import numpy as np
import pytest

pytest.importorskip("openvino")

CANCELLED = "Exception from src/bindings/python/src/pyopenvino/core/async_infer_queue.cpp: Infer Request was canceled"
JOIN_S = 20.0       # the old code never returned: the test fails here instead of hanging


class _StuckRequest:
    def __init__(self, q, k):
        self.q, self.k = q, k

    def cancel(self):
        self.q.cancel_seen.set()
        self.q.real[self.k].cancel()
        if self.q.started.is_set():      # a cancel before the stuck job started is a no-op, as in OpenVINO
            self.q.cancelled.set()

    def wait(self):
        self.q.real[self.k].wait()
        if self.k == 0 and self.q.started.is_set():
            self.q.cancelled.wait()
            raise RuntimeError(CANCELLED)


class StuckQueue:
    """The session's queue with the item ``stuck`` never completing until cancelled. ``busy``: the jobs
    after it wait in ``start_async`` (every job busy) and raise the cancel there, as OpenVINO's queue
    does. ``start_after_cancel``: the stuck item starts only once a cancel pass has run (a job that
    started as the watchdog's hook went over the queue)."""

    def __init__(self, real, stuck, busy=False, start_after_cancel=False):
        self.real, self.stuck, self.busy, self.start_after_cancel = real, stuck, busy, start_after_cancel
        self.started, self.cancelled, self.cancel_seen = threading.Event(), threading.Event(), threading.Event()

    def release(self):          # teardown: free a thread the old code left waiting
        self.cancel_seen.set()
        self.cancelled.set()

    def set_callback(self, fn):
        self.real.set_callback(fn)

    def start_async(self, feeds, userdata=None, share_inputs=False):
        if userdata == self.stuck:
            if self.start_after_cancel:
                self.cancel_seen.wait()
            self.started.set()
            return
        if self.busy and self.started.is_set():
            self.cancelled.wait()
            raise RuntimeError(CANCELLED)
        self.real.start_async(feeds, userdata=userdata, share_inputs=share_inputs)

    def wait_all(self):
        self.real.wait_all()
        if self.started.is_set():
            self.cancelled.wait()
            raise RuntimeError(CANCELLED)

    def __len__(self):
        return len(self.real)

    def __getitem__(self, k):
        return _StuckRequest(self, k)


def _feeds(n):
    return [{"x": np.array([[i, -i, 2 * i, 0.5]], np.float32)} for i in range(n)]


def _expected(feeds):
    return np.maximum(feeds["x"] * 0.5, 0)


def _run_bounded(fn):
    """fn() in a thread: (result or the exception, seconds), or a failure after JOIN_S."""
    box = {}

    def target():
        t0 = time.perf_counter()
        try:
            box["out"] = fn()
        except BaseException as exc:        # noqa: BLE001 - handed to the test
            box["out"] = exc
        box["s"] = time.perf_counter() - t0

    th = threading.Thread(target=target, daemon=True)
    th.start()
    th.join(JOIN_S)
    assert not th.is_alive(), f"run_many still waiting after {JOIN_S} s: the batch path hangs"
    return box["out"], box["s"]


@pytest.fixture
def session(tiny_ir):
    from edge_runtime.devices.openvino_backend import OpenVinoBackend

    path, bucket = tiny_ir
    sess = OpenVinoBackend().load(path, bucket, "cpu", {"precision": "f32", "cache": False, "jobs": 2})
    yield sess
    sess.close()


def _check_normal(sess, n=6, timeout_s=5.0):
    feeds = _feeds(n)
    queue = sess._throughput()[1]
    for t in (timeout_s, None):
        out = sess.run_many(feeds, timeout_s=t)
        for f, o in zip(feeds, out):
            assert isinstance(o, dict), o
            np.testing.assert_array_equal(o["y"], _expected(f))
            np.testing.assert_array_equal(o["y"], sess.run(f)["y"])     # the same as infer()'s request
    assert sess._throughput()[1] is queue           # the normal path keeps its queue


@pytest.mark.parametrize("stuck,busy", [(3, False), (1, True)], ids=["last-item-stuck", "every-job-busy"])
def test_a_job_that_never_completes_is_cancelled_at_the_deadline(session, stuck, busy):
    import openvino as ov

    _check_normal(session)
    tp = session._throughput()
    fake = StuckQueue(tp[1], stuck, busy=busy)
    tp[1] = fake
    feeds, timeout_s = _feeds(4), 0.4
    grace = timeout_s / len(feeds)
    try:
        out, took = _run_bounded(lambda: session.run_many(feeds, timeout_s=timeout_s))
    finally:
        fake.release()
    assert isinstance(out, list) and len(out) == 4, out
    assert took < timeout_s + grace + 3.0, took          # the deadline plus one item's share, not for ever
    assert took >= timeout_s + grace - 0.05, took        # a running job got its item's share past the deadline
    assert fake.cancelled.is_set()
    for i, (f, o) in enumerate(zip(feeds, out)):
        if i == stuck or (busy and i > stuck):         # stuck, or never started behind it
            assert isinstance(o, TimeoutError), (i, o)
        else:
            assert isinstance(o, dict), (i, o)
            np.testing.assert_array_equal(o["y"], _expected(f))
    # the cancelled queue would re-raise on every later batch: it was replaced, and the next batch is right
    assert tp[1] is not fake and isinstance(tp[1], ov.AsyncInferQueue)
    _check_normal(session)


def test_a_job_started_as_the_hook_ran_is_cancelled_too(session):
    """start_async waiting for an idle job may start one just after the watchdog's hook went over the
    queue: that job is cancelled as well, else wait_all waits for it for ever."""
    tp = session._throughput()
    fake = StuckQueue(tp[1], 1, start_after_cancel=True)
    tp[1] = fake
    feeds, timeout_s = _feeds(3), 0.3
    try:
        out, took = _run_bounded(lambda: session.run_many(feeds, timeout_s=timeout_s))
    finally:
        fake.release()
    assert took < timeout_s + timeout_s / 3 + 3.0, took
    assert isinstance(out[0], dict) and isinstance(out[1], TimeoutError) and isinstance(out[2], TimeoutError), out
    np.testing.assert_array_equal(out[0]["y"], _expected(feeds[0]))
    assert tp[1] is not fake
    _check_normal(session)


def test_a_late_hook_does_not_cancel_the_next_batch(session, monkeypatch):
    """The watchdog may fire just after a batch finished: its cancel must not reach the next batch's jobs."""
    from edge_runtime.devices import openvino_backend as ovb

    hooks = []
    real_arm = ovb.WATCHDOG.arm

    def arm(t_end):
        token, entry = real_arm(t_end + 3600)       # never fires by itself here
        hooks.append(token)
        return token, entry

    monkeypatch.setattr(ovb.WATCHDOG, "arm", arm)
    tp = session._throughput()
    out = session.run_many(_feeds(4), timeout_s=5.0)
    assert all(isinstance(o, dict) for o in out) and len(hooks) == 1
    seen = []

    class Spy(StuckQueue):
        def __getitem__(self, k):
            seen.append(k)
            return super().__getitem__(k)

    tp[1] = Spy(tp[1], None)
    hooks[0].fire()             # the first batch's hook, after its wait: nothing is cancelled
    assert seen == [] and not tp[1].cancel_seen.is_set()
    out = session.run_many(_feeds(4), timeout_s=5.0)
    for f, o in zip(_feeds(4), out):
        np.testing.assert_array_equal(o["y"], _expected(f))


def test_infer_batch_with_a_hung_job_is_a_typed_timeout(ov_digits_artifact):
    """Through the runtime: the stuck item is InferenceTimeout (inference_timeout), the others are
    right, and the next batch runs on a new queue."""
    import edge_runtime as er
    from conftest import ZOO
    from edge_runtime.evaluate import labelled_samples

    paths = [p for p, _ in labelled_samples(ZOO / "digits-cnn" / "held_out")][:4]
    with er.load(ov_digits_artifact, device="openvino:cpu", strict=True, device_options={"cache": False}) as rt:
        singles = [rt.infer(p) for p in paths]
        sess = rt._sessions[0]
        tp = sess._throughput()
        fake = StuckQueue(tp[1], 2)
        tp[1] = fake
        try:
            out, took = _run_bounded(lambda: rt.infer_batch(paths, deadline_ms=100))
        finally:
            fake.release()
        assert took < 0.4 + 0.1 + 3.0, took
        assert isinstance(out[2], er.InferenceTimeout) and out[2].code == "inference_timeout", out[2]
        for i in (0, 1, 3):
            assert out[i].prediction == singles[i].prediction
        again = rt.infer_batch(paths)
        assert [r.prediction for r in again] == [r.prediction for r in singles]
