"""Wrap an existing ONNX model, already quantized by its producer, into an artifact.

Nothing is converted: the file is copied and hashed. Its inputs and outputs
(names, numpy dtypes, shapes) are what ONNX Runtime reads from it; a symbolic
first (batch) dimension is pinned to 1, as TFLite import runs a ``-1`` batch;
any other dynamic dimension is refused (``import_shape_dynamic``). A model
holding external data files is refused (``import_onnx_invalid``): the artifact
carries one model file.

The quantization is recorded as found, from the graph's ops (``onnx_io.QUANTIZED_OPS``):
onnxruntime dynamic quantization (``DynamicQuantizeLinear`` with ``ConvInteger`` /
``MatMulInteger``), QDQ (``QuantizeLinear``/``DequantizeLinear``), QOperator
(``QLinear*``); the scheme names the ops and their counts, e.g. ``imported:
onnxruntime dynamic quantization (ConvInteger x64, DynamicQuantizeLinear x59)``.
Such a model becomes an ``onnx-int8`` variant. A model with none of those ops is
float: it is still imported, as an ``onnx-fp32`` variant with the scheme
``float (not quantized)``, and with a warning that ``edge-infer convert`` makes
an int8 artifact from it. Both run on the onnxruntime backend. Parity is
``not_measured``, as for TFLite import. The request's checks, the task's
sections, labels and the artifact are :mod:`.import_common`'s.
"""

from __future__ import annotations

from pathlib import Path

from edge_runtime import error_codes as ec
from edge_runtime.errors import ArtifactError, InputError
from edge_runtime.manifest import DTYPES

from .import_common import prepare, write_artifact

_ORT_DTYPES = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(double)": "float64",
               "tensor(int8)": "int8", "tensor(uint8)": "uint8", "tensor(int16)": "int16",
               "tensor(uint16)": "uint16", "tensor(int32)": "int32", "tensor(int64)": "int64",
               "tensor(bool)": "bool"}
# the input of each quantized op that holds its weights (when an initializer) / its activations' zero point
_WEIGHT_INPUT = {"ConvInteger": 1, "MatMulInteger": 1, "QLinearConv": 3, "QLinearMatMul": 3, "QGemm": 3,
                 "DynamicQuantizeMatMul": 1, "MatMulIntegerToFloat": 1}
_DYNAMIC_OPS = {"DynamicQuantizeLinear", "DynamicQuantizeMatMul", "DynamicQuantizeLSTM", "MatMulIntegerToFloat"}


def _spec(arg) -> dict:
    """One ONNX Runtime NodeArg as a manifest tensor spec; ``dynamic`` where a dimension other
    than the first has no fixed size (the first, the batch, is run as 1)."""
    dims = list(arg.shape or [])
    spec: dict = {"name": arg.name, "dtype": _ORT_DTYPES.get(arg.type, arg.type), "shape": []}
    for axis, d in enumerate(dims):
        fixed = isinstance(d, int) and d > 0
        if not fixed and axis > 0:
            spec["dynamic"] = True
            spec["declared"] = [d if isinstance(d, int) else (d or "?") for d in dims]
        spec["shape"].append(int(d) if fixed else 1)
    return spec


def _op_counts(graph) -> dict[str, int]:
    from .onnx_io import _all_nodes

    counts: dict[str, int] = {}
    for node in _all_nodes(graph):
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


def _weight_dtypes(model) -> list[str]:
    """The dtypes of the initializers the quantized ops take as weights."""
    import onnx

    from .onnx_io import _all_nodes

    inits = {t.name: t for t in model.graph.initializer}
    found = set()
    for node in _all_nodes(model.graph):
        k = _WEIGHT_INPUT.get(node.op_type)
        if node.op_type == "DequantizeLinear":
            k = 0
        if k is not None and len(node.input) > k and node.input[k] in inits:
            found.add(onnx.helper.tensor_dtype_to_np_dtype(inits[node.input[k]].data_type).name)
    return sorted(found)


def quantization(model, counts: dict[str, int], io_dtypes: list[str]) -> dict:
    """The variant's ``quantization`` record: what the graph's ops say, nothing assumed."""
    from .onnx_io import QUANTIZED_OPS

    quant = {op: n for op, n in sorted(counts.items()) if op in QUANTIZED_OPS}
    io = "/".join(io_dtypes) + " I/O"
    if not quant:
        return {"scheme": "float (not quantized)", "weights": "float (as in the model)", "activations": io,
                "quantized_ops": {}}
    if quant.keys() & _DYNAMIC_OPS:
        kind, acts = "onnxruntime dynamic quantization", f"uint8, quantized at run time (DynamicQuantizeLinear); {io}"
    elif any(op.startswith("Q") and op not in ("QuantizeLinear",) for op in quant):
        kind, acts = "QOperator", f"quantized inside QLinear ops; {io}"
    elif quant.keys() <= {"QuantizeLinear", "DequantizeLinear"}:
        kind, acts = "QDQ", f"QuantizeLinear/DequantizeLinear pairs; {io}"
    else:
        kind, acts = "quantized", io
    shown = ", ".join(f"{op} x{n}" for op, n in sorted(quant.items(), key=lambda kv: (-kv[1], kv[0])))
    weights = _weight_dtypes(model)
    return {"scheme": f"imported: {kind} ({shown})",
            "weights": "/".join(weights) + " (as in the model)" if weights else "as in the model",
            "activations": acts, "quantized_ops": quant}


def read_onnx(path: Path, warnings: list) -> dict:
    """``inputs``/``outputs`` (ONNX Runtime's reading), ``ops`` (op types in graph order),
    ``op_counts``, ``format``, ``opset``, ``producer``, ``quantization``; a float model warned about."""
    try:
        import onnx
        import onnxruntime as ort
    except ImportError as exc:
        raise InputError(f"importing an ONNX model needs onnx and onnxruntime ({exc}): "
                         f"pip install 'edge-runtime[convert-onnx]'", code=ec.IMPORT_NO_ONNX) from None
    from onnx.external_data_helper import uses_external_data

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError, or a file onnx cannot read
        raise ArtifactError(f"not an ONNX model onnx can read ({type(exc).__name__}: {str(exc).strip()[:200]})",
                            file=path.name, code=ec.IMPORT_ONNX_INVALID) from None
    if any(uses_external_data(t) for t in model.graph.initializer):
        raise ArtifactError("the model keeps its weights in external data files; an artifact carries one model "
                            "file (save it with onnx.save(model, F, save_as_external_data=False))",
                            file=path.name, code=ec.IMPORT_ONNX_INVALID)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    try:
        sess = ort.InferenceSession(str(path), sess_options=so, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - ORT raises its own Fail/InvalidGraph/... classes
        raise ArtifactError(f"ONNX Runtime refuses the model: {str(exc).strip()[:300]}", file=path.name,
                            code=ec.IMPORT_ONNX_INVALID) from None
    inputs = [_spec(a) for a in sess.get_inputs()]
    outputs = [_spec(a) for a in sess.get_outputs()]
    del sess
    odd = [f"{s['name']!r} ({s['dtype']})" for s in inputs + outputs if s["dtype"] not in DTYPES]
    if odd:
        raise InputError(f"tensor(s) {', '.join(odd)} have a dtype artifacts do not carry ({', '.join(DTYPES)})",
                         code=ec.IMPORT_MODEL_UNSUPPORTED)
    counts = _op_counts(model.graph)
    io_dtypes = sorted({s["dtype"] for s in inputs + outputs})
    quant = quantization(model, counts, io_dtypes)
    if not quant["quantized_ops"]:
        warnings.append(f"a float model (no QuantizeLinear, DequantizeLinear, ConvInteger, "
                        f"MatMulInteger or QLinear* ops): imported as float (onnx-fp32); "
                        f"`edge-infer convert {path.name} -o DIR --task ...` makes an int8 artifact from it")
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    producer = " ".join(p for p in (model.producer_name, model.producer_version) if p)
    return {"inputs": inputs, "outputs": outputs, "ops": [n.op_type for n in model.graph.node],
            "op_counts": counts, "format": "onnx", "opset": opset, "producer": producer, "quantization": quant}


def import_onnx(model: Path, out: Path, *, task: str = "image-classification", labels: Path | None = None,
                label_offset: int = 0, name: str | None = None, version: str = "1", force: bool = False,
                resize: str | None = None, scale=None, mean=None, std=None, **options) -> dict:
    """Import the ONNX ``model`` into the artifact directory ``out``; returns the manifest.
    The arguments are :func:`.tflite_import.import_tflite`'s."""
    import onnx
    import onnxruntime

    job = prepare(model, out, task=task, labels=labels, label_offset=label_offset, force=force,
                  options={"resize": resize, "scale": scale, "mean": mean, "std": std, **options}, read=read_onnx)
    info = job["info"]
    quant = info["quantization"]
    target = "onnx-int8" if quant["quantized_ops"] else "onnx-fp32"
    variant = {"quantization": quant,
               "toolchain": {"onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__,
                             "imported_ops": sum(info["op_counts"].values()), "opset": info["opset"]}}
    source = {"producer": info["producer"]} if info["producer"] else {}
    return write_artifact(job, task=task, name=name, version=version, target=target, rel=f"{target}/model.onnx",
                          variant=variant, source=source)
