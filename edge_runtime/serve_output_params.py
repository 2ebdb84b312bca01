"""The per-tensor parameters of a served request that change what an answer holds, for both protocols:
Triton's classification extension on a requested output, and its shared-memory parameters, which
this server does not implement and refuses.

- ``classification: N`` on a requested output of a classifier answers that output as BYTES
  ``[items, N]``, each element ``"<score>:<class index>:<label>"``, best first (the extension's
  ``<value>:<index>[:<label>]``; the value is the result's probability, ``%f`` as Triton prints
  it). A count over the model's classes is cut to them, as Triton does; a count over the top-k
  its results hold (``postprocess.top_k`` under the classes) is a 400: those classes were never
  ranked. On any other model, or on ``result``, it is a 400.
- ``shared_memory_region`` (and its byte size and offset), on an input or a requested output: a
  400 ``serve_extension_unsupported``. Ignored, an output's region would keep whatever it held
  while the client read it as the answer.
- Any other parameter on a requested output is a 400: a request this server does not understand
  is never answered as if it did.
"""

from __future__ import annotations

from typing import Any

from . import error_codes as ec
from .serve_types import BYTES, ServeError, Tensor

SHARED_MEMORY = ("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset")
HTTP_OUTPUT_PARAMETERS = ("binary_data", "classification")
GRPC_OUTPUT_PARAMETERS = ("classification",)


def _bad(message: str) -> ServeError:
    return ServeError("bad_request", message[:400], ec.SERVE_REQUEST_MALFORMED)


def refuse_shared_memory(where: str, params: dict) -> None:
    """A 400 ``serve_extension_unsupported`` when ``params`` ask for a shared-memory region."""
    hit = [k for k in SHARED_MEMORY if k in params]
    if hit:
        raise ServeError("bad_request", f"{where}: {hit[0]} is not supported by this server (no shared-memory "
                         "extension): send the data in the request and read the outputs from the response",
                         ec.SERVE_EXTENSION_UNSUPPORTED)


def classification_count(where: str, params: dict, allowed: tuple[str, ...]) -> int:
    """The classification count a requested output's ``params`` ask for (0: none); shared memory and
    any parameter not in ``allowed`` refused."""
    refuse_shared_memory(where, params)
    unknown = sorted(k for k in params if k not in allowed)
    if unknown:
        raise ServeError("bad_request", f"{where}: unknown parameter(s) {', '.join(map(repr, unknown))} "
                         f"(a requested output takes {', '.join(allowed)})"[:400], ec.SERVE_EXTENSION_UNSUPPORTED)
    count = params.get("classification", 0)
    if count is None:
        return 0
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise _bad(f"{where}: classification must be a non-negative integer, got {count!r}")
    return count


def classes_to_send(name: str, count: int, have: int, classes: int) -> int:
    """How many classes an output asked for ``count`` classes answers: cut to the model's ``classes``
    (-1: not stated), refused past the ``have`` its results rank."""
    n = min(count, classes) if classes > 0 else count
    if n > have:
        why = (f"this model ranks its top {have} of {classes} classes (the manifest's postprocess.top_k)"
               if classes > have else f"this model's results hold {have} classes")
        raise _bad(f"output {name!r}: classification asks for {count} classes, but {why}")
    return n


def classification_tensor(name: str, results: list, count: int, ranked: int, classes: int) -> Tensor:
    """``name`` as the classification extension answers it: BYTES ``[items, n]``. ``ranked`` is the
    top-k length the model's results hold (-1: not stated), ``classes`` its number of classes."""
    have = min(len(r.top_k or ()) for r in results)
    n = classes_to_send(name, count, min(have, ranked) if ranked >= 0 else have, classes)
    rows = []
    for r in results:
        for t in r.top_k[:n]:
            label = t.get("label")
            text = f"{float(t['score']):f}:{int(t['index'])}" + (f":{label}" if label not in (None, "") else "")
            rows.append(text.encode("utf-8"))
    return Tensor(name, BYTES, [len(results), n], rows)
