"""``edge-infer shadow`` and ``diff`` on two real MiniLM embedding artifacts of different recipes
(``transformer``, the default, vs ``transformer-fast``) over SST-2 sentences: the real cosine
agreement is reported and the diff names the recipe change."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from conftest import CACHE, shared
from edge_runtime.cli import main

pytestmark = pytest.mark.slow
SENTENCES = 40


@pytest.fixture(scope="module")
def fast_embedding_artifact(tmp_path_factory, minilm_embedding_artifact):
    from edge_runtime.converters.pipeline import convert
    from edge_runtime.converters.zoo import convert_request

    out = tmp_path_factory.mktemp("minilm-fast") / "artifact"
    # 100 calibration sentences instead of 300: a third of the build's CPU; the diff then also names
    # the calibration change (samples, fingerprint)
    convert(convert_request("minilm", "text-embedding", out, cache=CACHE, recipe="transformer-fast",
                            max_calibration=100))
    return out


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def test_two_minilm_recipes_shadowed_on_sst2(minilm_embedding_artifact, fast_embedding_artifact, tmp_path):
    rows = shared("text", "sst2", "dev.tsv").read_text(encoding="utf-8").splitlines()[:SENTENCES + 1]
    data = tmp_path / "sst2-head.tsv"
    data.write_text("\n".join(rows) + "\n", encoding="utf-8")
    res = run("diff", minilm_embedding_artifact, fast_embedding_artifact)
    assert res.exit_code == 1, res.output
    pred = res.output.split("prediction side")[1].split("inference side")[0]
    assert 'quantization.recipe: "transformer" -> "transformer-fast"' in pred
    assert "quantization.calibration.fingerprint" in pred
    res = run("shadow", minilm_embedding_artifact, fast_embedding_artifact, data, "--json", "--quiet",
              "-o", tmp_path / "pairs.jsonl", "--worst", "3")
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    cos = s["figures"]["cosine"]
    print(f"MiniLM embedding transformer vs transformer-fast on {s['total']} SST-2 sentences: agreement "
          f"{s['agreement']} (cosine >= {s['agree_at']}), cosine mean {cos['mean']} min {cos['min']}; latency p50 "
          f"A {s['latency_ms']['a']['p50']} B {s['latency_ms']['b']['p50']} ms [{s['cpu']}]")
    assert s["total"] == s["compared"] == SENTENCES and s["kind"] == "embedding" and s["agree_at"] == 0.99
    assert cos["mean"] > 0.99 and 0.9 < cos["min"] <= 1.0 and s["agreement"] >= 0.9
    assert s["accuracy"] is None and s["matrix"] is None
    first = json.loads((tmp_path / "pairs.jsonl").read_text().splitlines()[0])
    assert first["input"] == rows[1].rsplit("\t", 1)[0] and len(first["a"]["result"]["embedding"]) == 384
    few = tmp_path / "few.tsv"
    few.write_text("\n".join(rows[:11]) + "\n", encoding="utf-8")
    res = run("shadow", minilm_embedding_artifact, fast_embedding_artifact, few, "--agree-at", "0.9999",
              "--min-agreement", "0.99", "--quiet")
    assert res.exit_code == 7 and "shadow_agreement_below" in res.output
