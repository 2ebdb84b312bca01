"""Which held-out samples become the probe set: every bucket of the artifact covered.

Each bucket is its own compiled model on the target machine, so a probe set
that never reaches one (all SST-2 sentences fit the 64-token bucket, and the
128-token one was never run by ``verify``) leaves that model unchecked while
``verify`` says "pass". The probe set therefore takes, from the held-out
samples in their order, at least ``min(PER_BUCKET, count // buckets)`` routed
to each bucket (these first in the file, so the byte cap cuts the rest first),
then fills up in held-out order. A bucket no single held-out
sample reaches gets samples the task joins from consecutive held-out ones
(``Task.joined_sample``: texts joined with a space, a longer review), as long
as joining reaches it; a bucket still unreached is named in the manifest, and
``verify`` reports it as unverified.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from edge_runtime.errors import EdgeRuntimeError

PER_BUCKET = 4          # probes per bucket at least, where the count allows
SCAN_FACTOR = 32        # held-out samples looked at: at most this many times the count


@dataclass
class Picked:
    raws: list                                  # the probe inputs, in order
    buckets: list[int]                          # the bucket prepare routes each one to
    composed: dict[int, int] = field(default_factory=dict)     # bucket -> probes joined from held-out samples


def pick(task, held: list, count: int, limits) -> Picked:
    """The probe inputs for ``task`` from the held-out samples ``held`` (at most ``count``)."""
    n_buckets = len(task.buckets)
    quota = min(PER_BUCKET, count // max(n_buckets, 1))
    routed: list[tuple[int, object, int]] = []        # (held-out index, raw, bucket)
    per = [0] * n_buckets
    for i, raw in enumerate(held[:count * SCAN_FACTOR]):
        if len(routed) >= count and min(per, default=quota) >= quota:
            break             # enough, every bucket its share: no more samples to prepare (images cost ms)
        bucket = _bucket(task, raw, limits)
        if bucket is not None:
            routed.append((i, raw, bucket))
            per[bucket] += 1
    chosen: list[tuple[int, object, int, bool, bool]] = []     # (order, raw, bucket, joined, in a floor)
    taken: set[int] = set()
    for b in range(n_buckets):                        # the floor of each bucket first
        for i, raw, bucket in [r for r in routed if r[2] == b][:quota]:
            chosen.append((i, raw, bucket, False, True))
            taken.add(i)
    for i, raw, bucket in routed:                     # then held-out order
        if len(chosen) >= count:
            break
        if i not in taken:
            chosen.append((i, raw, bucket, False, False))
            taken.add(i)
    composed: dict[int, int] = {}
    reached = {c[2] for c in chosen}
    for b in range(n_buckets):
        if b in reached or quota == 0:
            continue
        made = _joined(task, [r for _, r, _ in routed], b, quota, limits)
        if made:
            composed[b] = len(made)
            chosen.extend((len(held) * (1 + b) + k, raw, b, True, True) for k, raw in enumerate(made))
    chosen = _trim(chosen, count, quota)
    chosen.sort(key=lambda c: (not c[4], c[0]))      # the floors first: a byte cap cuts the filling first
    return Picked([c[1] for c in chosen], [c[2] for c in chosen], composed)


def spread(held: list, count: int) -> list:
    """``held`` reordered so that its first ``count`` samples are spread evenly over it (every k-th,
    k = ceil(len / count), from the first), then the rest in the same stride: ``pick`` takes its
    probes from the front. A --parity-data folder loads sorted by label (digits' held_out/0..9),
    so its first 32 of 360 were all "0" and ``verify`` checked one class of ten."""
    n = len(held)
    if count <= 0 or n <= count:
        return list(held)
    k = -(-n // count)
    return [held[i] for i in sorted(range(n), key=lambda i: (i % k, i))]


def _bucket(task, raw, limits) -> int | None:
    try:
        return task.prepare(raw, limits).bucket
    except EdgeRuntimeError:
        return None          # not a parity sample either (parity.measure skips it the same way)


def _joined(task, raws: list, bucket: int, want: int, limits) -> list:
    """Up to ``want`` inputs routed to ``bucket``, each joined from consecutive held-out samples
    (disjoint runs); none when the task cannot join samples."""
    out: list = []
    at = 0
    while len(out) < want and at < len(raws):
        acc = raws[at]
        at += 1
        while at < len(raws):
            acc = task.joined_sample(acc, raws[at])
            at += 1
            if acc is None:
                return out
            got = _bucket(task, acc, limits)
            if got is None or got > bucket:
                break          # past it (or refused): start a new run
            if got == bucket:
                out.append(acc)
                break
    return out


def _trim(chosen: list, count: int, quota: int) -> list:
    """At most ``count``: joined probes replace the latest held-out ones of the best-covered bucket."""
    while len(chosen) > count:
        per: dict[int, int] = {}
        for c in chosen:
            per[c[2]] = per.get(c[2], 0) + 1
        fullest = max(per, key=lambda b: per[b])
        drop = max((k for k, c in enumerate(chosen) if c[2] == fullest and not c[3]),
                   key=lambda k: chosen[k][0], default=None)
        if drop is None or per[fullest] <= quota:
            break
        chosen.pop(drop)
    return chosen
