"""NaN or infinity from a device is a typed failure (non_finite_output), never a result (#17 item 5)."""

import numpy as np
import pytest

import edge_runtime as er
from edge_runtime import error_codes as ec


def _feeds(rt):
    return {t["name"]: np.ones(t["shape"], t["dtype"]) for t in rt.variant["buckets"][0]["inputs"]}


@pytest.mark.parametrize("task", ["text-classification", "text-embedding", "image-classification", "tensors"])
def test_a_device_returning_nan_is_a_runtime_error_not_a_result(make_artifact, task):
    art = make_artifact(task)
    raw = {"text-classification": "good movie", "text-embedding": "good movie",
           "image-classification": np.eye(8, dtype=np.uint8) * 200}.get(task)
    with er.load(art, device="fake") as rt:                                   # the same path, healthy device
        healthy = rt.infer(_feeds(rt) if raw is None else raw)
        assert healthy.prediction is not None or healthy.embedding is not None or healthy.outputs
    with er.load(art, device="fake", device_options={"nan_after": 0}) as rt:   # NaN from the first run on
        raw = _feeds(rt) if raw is None else raw
        with pytest.raises(er.InferenceRuntimeError) as ei:
            rt.infer(raw)
        err = ei.value
        assert err.code == ec.NON_FINITE_OUTPUT == "non_finite_output" and err.exit_code == 6
        assert "non-finite" in err.message and err.details["output"]
        batch = rt.infer_batch([raw, raw])                       # the batch path: each item its own error
        assert all(isinstance(r, er.InferenceRuntimeError) and r.code == ec.NON_FINITE_OUTPUT for r in batch)
        counted = {e["code"]: e["count"] for e in rt.metrics()["errors"]}
        assert counted.get(ec.NON_FINITE_OUTPUT, 0) >= 1


def test_a_tensors_artifact_built_to_pass_nonfinite_values_returns_them(make_artifact):
    from factories import rewrite_manifest

    art = make_artifact("tensors")
    rewrite_manifest(art, lambda m: m["preprocess"].update(allow_nonfinite=True))
    with er.load(art, device="fake", device_options={"nan_after": 0}) as rt:
        res = rt.infer(_feeds(rt))
        assert any(np.isnan(np.asarray(v)).any() for v in res.outputs.values())


def test_the_cli_exits_6_with_the_code(make_artifact, tmp_path):
    import json

    from click.testing import CliRunner

    from edge_runtime.cli import main

    art = make_artifact("text-embedding")
    res = CliRunner().invoke(main, ["infer", str(art), "--text", "hello", "--device", "fake",
                                    "--device-option", "nan_after=0", "--json"])
    assert res.exit_code == 6, res.output
    assert json.loads(res.stdout)["error"]["code"] == "non_finite_output"


@pytest.mark.parametrize("size", [10, 256, 257, 4096])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, np.complex64])
def test_the_scan_finds_every_kind_of_non_finite_value_small_or_large(size, dtype):
    """The guard's two paths (Python's sum up to 256 values, numpy's above) agree: any NaN or
    infinity anywhere is found; finite values whose sum overflows are not one."""
    from edge_runtime.runtime import has_non_finite

    clean = np.linspace(-3, 3, size).astype(dtype)
    assert not has_non_finite(clean)
    for bad in (np.nan, np.inf, -np.inf):
        for at in (0, size // 2, size - 1):
            arr = clean.copy()
            arr[at] = bad
            assert has_non_finite(arr), (bad, at)
            assert has_non_finite(arr.reshape(1, -1)[:, ::-1]), (bad, at)     # non-contiguous view
    big = np.full(size, np.finfo(dtype).max, dtype)            # finite; its sum overflows
    assert not has_non_finite(big)
    assert not has_non_finite(np.full(size, 7, np.int8))       # integers hold no NaN: never scanned
