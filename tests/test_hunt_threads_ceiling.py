"""A thread count far past the machine's CPUs (``EDGE_RUNTIME_THREADS=100000``, ``threads=2**33``) was taken
as given: onnxruntime spent over a minute starting 100000 threads (no answer: a hang ended by a timeout), and
2**33 reached the vendor as a TypeError reported as device_load_failed. Now refused at once, typed, naming
the bound: 4 per logical CPU."""

from __future__ import annotations

import os

import pytest

import edge_runtime as er
from edge_runtime.devices.options import resolve_options, threads_ceiling, threads_option


def test_the_ceiling_is_four_per_logical_cpu_and_says_so():
    hi, why = threads_ceiling()
    assert hi == 4 * (os.cpu_count() or 1) and f"{os.cpu_count()} here" in why


@pytest.mark.parametrize("value", [100000, 2**33, "100000"])
def test_a_caller_asking_for_too_many_threads_is_refused_before_loading(digits_artifact, value):
    with pytest.raises(er.InputError) as e:
        er.load(digits_artifact, device="onnxruntime", device_options={"threads": value})
    assert e.value.code == "device_option_invalid" and f"<= {threads_ceiling()[0]}" in str(e.value)


def test_the_environment_asking_for_too_many_is_the_operators_error(digits_artifact, monkeypatch):
    monkeypatch.setenv("EDGE_RUNTIME_THREADS", "100000")
    with pytest.raises(er.DeviceError) as e:
        er.load(digits_artifact, device="onnxruntime")
    assert e.value.code == "device_option_invalid" and "EDGE_RUNTIME_THREADS" in str(e.value)


def test_up_to_the_ceiling_is_taken_and_declared():
    hi, _ = threads_ceiling()
    opt = threads_option()
    assert resolve_options([opt], {"threads": hi}, "x").values["threads"] == hi
    assert opt.describe()["maximum"] == hi
