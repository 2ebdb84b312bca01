"""The probe set reaches every bucket of the artifact (``converters/probe_select.py``), and
``verify`` names a bucket no probe reached as not verified (its model did not run)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import edge_runtime as er
from edge_runtime.cli import main
from edge_runtime.converters.probe_select import PER_BUCKET, pick
from edge_runtime.errors import InputError
from edge_runtime.limits import DEFAULT_LIMITS


class _Words:
    """A task whose inputs are texts: up to 5 words go to bucket 0, up to 12 to bucket 1, longer
    ones to bucket 2 (truncated); "bad" is refused, as prepare refuses an empty text."""

    def __init__(self, join=True):
        self.buckets = [{"name": "short"}, {"name": "mid"}, {"name": "long"}]
        self.join = join

    def prepare(self, raw, limits):
        if raw == "bad":
            raise InputError("refused")
        n = len(raw.split())
        return type("P", (), {"bucket": 0 if n <= 5 else 1 if n <= 12 else 2})()

    def joined_sample(self, a, b):
        return f"{a} {b}" if self.join else None


def _texts(words_each: list[int]) -> list[str]:
    return [" ".join(f"w{i}x{k}" for k in range(n)) for i, n in enumerate(words_each)]


def test_every_bucket_gets_its_share_even_when_its_samples_come_late():
    held = _texts([3] * 40 + [8] * 6 + [20] * 6)          # the first 32 all fit "short"
    got = pick(_Words(), held, 32, DEFAULT_LIMITS)
    assert len(got.raws) == 32 and got.composed == {}
    assert [got.buckets.count(b) for b in range(3)] == [32 - 2 * PER_BUCKET, PER_BUCKET, PER_BUCKET]
    order = [held.index(r) for r in got.raws]
    floors = order[:3 * PER_BUCKET]                        # each bucket's share first (a byte cap cuts the rest)
    assert [got.buckets[k] for k in range(3 * PER_BUCKET)] == sorted(got.buckets[:3 * PER_BUCKET])
    assert floors == sorted(floors) and order[3 * PER_BUCKET:] == sorted(order[3 * PER_BUCKET:])
    first = pick(_Words(), held, 32, DEFAULT_LIMITS)
    assert first.raws == got.raws                          # deterministic


def test_a_bucket_no_held_out_sample_reaches_gets_joined_samples():
    held = _texts([3] * 60)                                # short sentences only (SST-2 and seq128)
    got = pick(_Words(), held, 32, DEFAULT_LIMITS)
    assert len(got.raws) == 32
    assert [got.buckets.count(b) for b in range(3)] == [32 - 2 * PER_BUCKET, PER_BUCKET, PER_BUCKET]
    assert got.composed == {1: PER_BUCKET, 2: PER_BUCKET}
    joined = [r for r, b in zip(got.raws, got.buckets) if b == 2]
    assert all(len(r.split()) > 12 for r in joined) and all(r in " ".join(held) for r in joined)
    assert got.buckets[:3 * PER_BUCKET] == [0] * PER_BUCKET + [1] * PER_BUCKET + [2] * PER_BUCKET  # floors first


def test_a_task_that_cannot_join_leaves_the_bucket_unreached_and_refused_samples_are_skipped():
    held = ["bad"] + _texts([3] * 40)
    got = pick(_Words(join=False), held, 32, DEFAULT_LIMITS)
    assert got.buckets == [0] * 32 and got.composed == {} and "bad" not in got.raws
    tiny = pick(_Words(), _texts([3] * 5 + [8] * 5), 2, DEFAULT_LIMITS)        # fewer probes than buckets
    assert tiny.buckets == [0, 0]                                             # held-out order only


def test_verify_names_a_bucket_no_probe_reached(make_artifact):
    art = make_artifact("text-embedding", probe=8, buckets=(8, 16, 64))
    man = json.loads((art / "manifest.json").read_text())
    longest = man["variants"][0]["buckets"][-1]["name"]
    res = CliRunner().invoke(main, ["verify", str(art), "--json"])
    assert res.exit_code == 0, res.output
    row = json.loads(res.output)["chosen"]
    assert row["unverified_buckets"] == [longest] and row["buckets"][longest] == 0
    assert sum(row["buckets"].values()) == 8
    text = CliRunner().invoke(main, ["verify", str(art)])
    assert f"no probe reached bucket {longest}: not verified" in text.output
    shown = CliRunner().invoke(main, ["inspect", str(art)]).output       # a probe section of before the coverage
    assert "probe set: 8 samples" in shown and "built before per-bucket coverage" in shown
    with er.load(art, verify=True) as rt:
        info = rt.info()
    assert info["verified_here"]["unverified_buckets"] == [longest]
    assert info["isa"]["verified_here"]["unverified_buckets"] == [longest]      # remembered for this machine
    other = make_artifact("text-embedding", probe=8, buckets=(8, 16, 64), host_info={"int8_class": "not-this-cpu",
                                                                                       "cpu": "elsewhere"})
    with er.load(other, verify=True) as rt:
        note = rt.info()["isa"]["note"]
    assert note.startswith("the recorded parity was measured on not-this-cpu (elsewhere)")
    assert "verified here: cosine_mean" in note and f"(no probe reached bucket {longest}: not verified)" in note


@pytest.mark.parametrize("buckets", [(8, 16)])
def test_a_probe_set_reaching_every_bucket_verifies_them_all(make_artifact, buckets):
    art = make_artifact("text-embedding", probe=16, buckets=buckets)
    row = json.loads(CliRunner().invoke(main, ["verify", str(art), "--json"]).output)["chosen"]
    assert row["unverified_buckets"] == [] and all(k > 0 for k in row["buckets"].values())


def test_the_scan_stops_once_every_bucket_has_its_share():
    """Images cost milliseconds to prepare: a one-bucket task prepares `count` samples, not the set."""
    task = _Words()
    calls = []
    real = task.prepare
    task.prepare = lambda raw, limits: calls.append(raw) or real(raw, limits)
    task.buckets = task.buckets[:1]
    got = pick(task, _texts([3] * 1000), 32, DEFAULT_LIMITS)
    assert len(got.raws) == 32 and len(calls) == 32
