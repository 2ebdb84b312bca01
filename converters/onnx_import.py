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
from .onnx_head import head_columns

_ORT_DTYPES = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(double)": "float64",
               "tensor(int8)": "int8", "tensor(uint8)": "uint8", "tensor(int16)": "int16",
               "tensor(uint16)": "uint16", "tensor(int32)": "int32", "tensor(int64)": "int64",
               "tensor(bool)": "bool"}
# the input of each quantized op that holds its weights (when an initializer) / its activations' zero point
_WEIGHT_INPUT = {"ConvInteger": 1, "MatMulInteger": 1, "QLinearConv": 3, "QLinearMatMul": 3, "QGemm": 3,
                 "DynamicQuantizeMatMul": 1, "MatMulIntegerToFloat": 1}
_DYNAMIC_OPS = {"DynamicQuantizeLinear", "DynamicQuantizeMatMul", "DynamicQuantizeLSTM", "MatMulIntegerToFloat"}
# where the (scale, zero point) of a quantized op's operand sits: {op: {operand index: (scale, zero point)}},
# and of its output; an 8-bit graph input or output takes its quantization from the op that reads or writes it
_OPERAND_QPARAMS = {"DequantizeLinear": {0: (1, 2)}, "QLinearConv": {0: (1, 2), 3: (4, 5)},
                    "QLinearMatMul": {0: (1, 2), 3: (4, 5)}, "QLinearAdd": {0: (1, 2), 3: (4, 5)},
                    "QLinearMul": {0: (1, 2), 3: (4, 5)}, "QLinearGlobalAveragePool": {0: (1, 2)},
                    "QLinearAveragePool": {0: (1, 2)}, "QLinearSigmoid": {0: (1, 2)},
                    "QLinearLeakyRelu": {0: (1, 2)}, "QLinearSoftmax": {0: (1, 2)}}
_OUTPUT_QPARAMS = {"QuantizeLinear": (1, 2), "QLinearConv": (6, 7), "QLinearMatMul": (6, 7), "QLinearAdd": (6, 7),
                   "QLinearMul": (6, 7), "QLinearGlobalAveragePool": (3, 4), "QLinearAveragePool": (3, 4),
                   "QLinearSigmoid": (3, 4), "QLinearLeakyRelu": (3, 4), "QLinearSoftmax": (3, 4)}


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


def _all_tensors(graph):
    """Every TensorProto the graph holds: initializers (sparse ones too) and the tensors in node
    attributes (a ``Constant``'s value, say), subgraphs included: any of them may keep its data
    in an external file (``onnx.save(..., convert_attribute=True)`` moves the attributes' too)."""
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
        yield sparse.indices
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("g"):
                yield from _all_tensors(attr.g)
            for sub in attr.graphs:
                yield from _all_tensors(sub)


_PASS_THROUGH = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "QuantizeLinear", "DequantizeLinear",
                 "Cast"}


def softmax_outputs(graph) -> list[str]:
    """The graph outputs a ``Softmax`` writes (through reshapes, casts and re-quantization): they
    are probabilities already. The classifier's own check looks for TFLite's ``SOFTMAX`` among the
    last ops, which an ONNX graph never names, so its probabilities were softmaxed again."""
    producer = {o: n for n in graph.node for o in n.output}
    found = []
    for out in graph.output:
        node = producer.get(out.name)
        for _ in range(6):
            if node is None or node.op_type not in _PASS_THROUGH or not node.input:
                break
            node = producer.get(node.input[0])
        if node is not None and node.op_type in ("Softmax", "QLinearSoftmax"):
            found.append(out.name)
    return found


def _constants(graph) -> dict:
    """Initializers and ``Constant`` nodes' values by name (numpy arrays)."""
    from onnx import numpy_helper

    found = {t.name: t for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.output:
            for attr in node.attribute:
                if attr.name == "value":
                    found[node.output[0]] = attr.t
    out = {}
    for name, t in found.items():
        try:
            out[name] = numpy_helper.to_array(t)
        except Exception:  # noqa: BLE001 - an external or odd tensor: not a readable constant
            continue
    return out


def _qparams(node, at: tuple[int, int], consts: dict) -> dict | str:
    """``{"scale", "zero_point"}`` from ``node``'s inputs ``at`` (the zero point may be absent:
    0), or why not (a string)."""
    import numpy as np

    si, zi = at
    if len(node.input) <= si or node.input[si] not in consts:
        return f"{node.op_type} {node.name or ''} takes a scale that is not a constant".replace("  ", " ")
    scale = np.asarray(consts[node.input[si]])
    zp_name = node.input[zi] if len(node.input) > zi else ""
    if zp_name and zp_name not in consts:
        return f"{node.op_type} takes a zero point that is not a constant"
    zero = np.asarray(consts[zp_name]) if zp_name else np.zeros((), np.int64)
    if scale.size != 1 or zero.size != 1:
        return f"{node.op_type} quantizes it per axis ({scale.size} scales)"
    if not float(scale.reshape(-1)[0]) > 0:
        return f"{node.op_type} has scale {float(scale.reshape(-1)[0])}"
    return {"scale": float(scale.reshape(-1)[0]), "zero_point": int(zero.reshape(-1)[0])}


def io_quantization(model, inputs: list[dict], outputs: list[dict], warnings: list) -> None:
    """Give each 8-bit graph input and output the ``quantization`` of the op that reads it
    (``DequantizeLinear``, ``QLinear*``) or writes it (``QuantizeLinear``, ``QLinear*``), as TFLite
    import reads it from the model: without it a uint8/int8 input would take the pixels as they
    are and an output's integers would be taken for its values. One that cannot be read
    (per-axis, not a constant, or no such op next to it) is warned about and left integer."""
    graph = model.graph
    consts = _constants(graph)
    for specs, side in ((inputs, "input"), (outputs, "output")):
        for spec in specs:
            if spec["dtype"] not in ("int8", "uint8"):
                continue
            found: list = []
            for node in graph.node:
                if side == "input":
                    for k, at in _OPERAND_QPARAMS.get(node.op_type, {}).items():
                        if len(node.input) > k and node.input[k] == spec["name"]:
                            found.append(_qparams(node, at, consts))
                elif spec["name"] in node.output and node.op_type in _OUTPUT_QPARAMS:
                    found.append(_qparams(node, _OUTPUT_QPARAMS[node.op_type], consts))
            params = [f for f in found if isinstance(f, dict)]
            if params and len(params) == len(found) and all(p == params[0] for p in params):
                spec["quantization"] = params[0]
                continue
            why = next((f for f in found if isinstance(f, str)), None)
            if params and why is None:
                why = "the ops that read it quantize it differently"
            warnings.append(f"{side} {spec['name']!r} is {spec['dtype']} without a quantization the import can read "
                            f"({why or 'no QuantizeLinear/DequantizeLinear/QLinear op next to it'}): "
                            + ("its values are taken as they are (no scale, zero point 0)" if side == "output"
                               else "the pixels are normalised and cast to it without a scale and zero point"))


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
    if any(uses_external_data(t) for t in _all_tensors(model.graph)):
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
    io_quantization(model, inputs, outputs, warnings)
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
            "softmax_outputs": softmax_outputs(model.graph), "head_columns": head_columns(model),
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
    post = job["post"]
    if post.get("softmax") is True and post.get("output") in info["softmax_outputs"]:
        job["post"] = {**post, "softmax": False}      # probabilities already: not softmaxed again
    quant = info["quantization"]
    target = "onnx-int8" if quant["quantized_ops"] else "onnx-fp32"
    variant = {"quantization": quant,
               "toolchain": {"onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__,
                             "imported_ops": sum(info["op_counts"].values()), "opset": info["opset"]}}
    source = {"producer": info["producer"]} if info["producer"] else {}
    return write_artifact(job, task=task, name=name, version=version, target=target, rel=f"{target}/model.onnx",
                          variant=variant, source=source)
