"""The tensors task's parity (``cosine_mean``) sees a wrong magnitude: a cosine alone does not (a
dequantization scale x50 keeps it at 1.0; a one-value output's cosine is only its sign)."""

from __future__ import annotations

import numpy as np
import pytest

from edge_runtime.models.base import Outputs, TaskOutput
from edge_runtime.models.tensors import NORM_SLACK, Tensors


def _outs(values) -> list[TaskOutput]:
    return [TaskOutput(outputs=Outputs({"y": np.asarray(v, dtype=np.float32)})) for v in values]


def _pair(scale=1.0, noise=0.0, n=32, width=1, seed=0):
    rng = np.random.default_rng(seed)
    ref = [rng.standard_normal(width) + 1.5 for _ in range(n)]
    cand = [r * scale + rng.standard_normal(width) * noise for r in ref]
    return _outs(ref), _outs(cand)


def test_a_wrong_scale_is_under_any_budget_even_on_a_one_value_output():
    ref, cand = _pair(scale=50.0)
    fig = Tensors.compare(ref, cand)
    assert fig["value"] < 0.05 and fig["norm_ratio"] == pytest.approx(50.0, rel=1e-6)
    ref, cand = _pair(scale=0.1, width=16)
    assert Tensors.compare(ref, cand)["value"] < 0.2


def test_an_int8_sized_error_keeps_the_plain_cosine():
    ref, cand = _pair(scale=1.01, noise=0.01, width=16)
    fig = Tensors.compare(ref, cand)
    a = [np.asarray(r.outputs["y"], np.float64) for r in ref]
    b = [np.asarray(c.outputs["y"], np.float64) for c in cand]
    plain = np.mean([x @ y / (np.linalg.norm(x) * np.linalg.norm(y)) for x, y in zip(a, b)])
    assert fig["value"] == pytest.approx(plain, abs=1e-6) and fig["value"] > 0.99
    assert 1 / NORM_SLACK < fig["norm_ratio"] < NORM_SLACK


def test_near_zero_samples_do_not_swing_the_magnitude():
    """One sample near zero, whose int8 value is double its float one, is not a wrong scale."""
    ref = _outs([[1.0], [2.0], [0.001], [-1.5]])
    cand = _outs([[1.01], [1.98], [0.002], [-1.49]])
    fig = Tensors.compare(ref, cand)
    assert fig["value"] == pytest.approx(1.0) and fig["norm_ratio"] == pytest.approx(1.0, abs=0.01)


def test_zero_outputs_on_both_sides_agree_and_nothing_is_no_figure():
    assert Tensors.compare(_outs([[0.0]]), _outs([[0.0]]))["norm_ratio"] == 1.0
    assert Tensors.compare([], [])["value"] is None
    assert Tensors.compare(_outs([[0.0]]), _outs([[3.0]]))["value"] == 0.0
