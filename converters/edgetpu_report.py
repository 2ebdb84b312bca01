"""Static Edge TPU compatibility report from a :func:`.tflite_inspect.inspect_tflite` result.

No ``edgetpu_compiler`` is needed: :func:`edgetpu_report` checks each operator
of the main subgraph, in execution order, against Coral's published model
requirements ("TensorFlow models on the Edge TPU", coral.ai/docs/edgetpu/
models-intro: supported operations; int8/uint8 tensors; sizes constant at
compile time; tensors of rank > 3 may only have the 3 innermost dimensions
> 1) and models the compiler's single partition: ops are mapped up to the
first unsupported op and that op and everything after it run on the CPU.

Boundary ops do not end the Edge TPU segment: a QUANTIZE that converts a
float model input to int8 (at the start) and a DEQUANTIZE that produces a
float model output (at the end) run on the CPU around it. An
already-compiled model (``edgetpu-custom-op``) is reported as such; a model
whose quantization parameters TFLite's loader rejects is not compilable. This is
a static estimate: the compiler may still refuse an op for limitations not
visible here (operation versions, op-specific shape limits).
"""

from __future__ import annotations

from collections import Counter

ON_CHIP_BYTES = 8 * 1024 * 1024  # Edge TPU SRAM for caching parameters (~8 MiB; a little less is usable)
EDGETPU_OP = "edgetpu-custom-op"
_INT8 = ("int8", "uint8")
_FLOAT = ("float32", "float16", "bfloat16", "float64")

# Builtin ops the Edge TPU compiler can map, with the documented limitation (informational).
SUPPORTED_OPS = {
    "ADD": "",
    "AVERAGE_POOL_2D": "no fused activation function",
    "CONCATENATION": "no fused activation; a constant input only as an all-zero second input",
    "CONV_2D": "same dilation in x and y",
    "DEPTHWISE_CONV_2D": "same dilation in x and y",
    "DEQUANTIZE": "only at the end of the model (runs on the CPU after the Edge TPU segment)",
    "EXP": "",
    "EXPAND_DIMS": "",
    "FILL": "",
    "FULLY_CONNECTED": "default weights format only",
    "GATHER": "",
    "HARD_SWISH": "",
    "L2_NORMALIZATION": "",
    "LOGISTIC": "",
    "UNIDIRECTIONAL_SEQUENCE_LSTM": "unidirectional LSTM only",
    "MAX_POOL_2D": "no fused activation function",
    "MAXIMUM": "",
    "MEAN": "no reduction along the batch dimension",
    "MINIMUM": "",
    "MUL": "",
    "PACK": "no packing along the batch dimension",
    "PAD": "no padding along the batch dimension",
    "PRELU": "constant alpha",
    "QUANTIZE": "int8/uint8 requantization; a float-input QUANTIZE runs on the CPU",
    "REDUCE_MAX": "no reduction along the batch dimension",
    "REDUCE_MIN": "no reduction along the batch dimension",
    "RELU": "",
    "RELU6": "",
    "RELU_N1_TO_1": "",
    "RESHAPE": "very large tensors may not be mapped",
    "RESIZE_BILINEAR": "3-D input/output; may be left on the CPU to avoid precision loss",
    "RESIZE_NEAREST_NEIGHBOR": "3-D input/output",
    "RSQRT": "",
    "SLICE": "",
    "SOFTMAX": "1-D input, limited size",
    "SPACE_TO_DEPTH": "",
    "SPLIT": "no split along the batch dimension",
    "SQRT": "",
    "SQUARED_DIFFERENCE": "",
    "SQUEEZE": "",
    "STRIDED_SLICE": "strides of 1 (a plain slice)",
    "SUB": "",
    "SUM": "no reduction along the batch dimension",
    "TANH": "",
    "TRANSPOSE": "",
    "TRANSPOSE_CONV": "",
}

# int16 state tensors the compiler accepts (Coral's keras_lstm_mnist_ptq compiles to a single edgetpu-custom-op).
_INT16_STATE_OK = {"UNIDIRECTIONAL_SEQUENCE_LSTM"}


def _outer_dims_ok(shape) -> bool:
    """Rank <= 3, or every dimension outside the 3 innermost is 1."""
    return len(shape) <= 3 or all(d == 1 for d in shape[:-3])


def _io_indices(sg) -> tuple[set, set]:
    return {t["index"] for t in sg["inputs"]}, {t["index"] for t in sg["outputs"]}


def _boundary(op, sg_inputs, sg_outputs) -> str | None:
    """Why ``op`` is a CPU boundary op around the Edge TPU segment, or None."""
    ins, outs = op["inputs"], op["outputs"]
    if op["op"] == "QUANTIZE" and ins and ins[0]["dtype"] in _FLOAT and ins[0]["tensor"] in sg_inputs:
        return "float input quantization runs on the CPU before the Edge TPU segment"
    if op["op"] == "DEQUANTIZE" and outs and all(o["tensor"] in sg_outputs for o in outs):
        return "output dequantization runs on the CPU after the Edge TPU segment"
    return None


def _unsupported(op) -> str | None:
    """Why ``op`` cannot be mapped to the Edge TPU, or None when it can."""
    name = op["op"]
    if "custom_code" in op:
        if name.startswith("Flex"):
            return f"Flex (TensorFlow) op {name} cannot run on the Edge TPU"
        return f"custom op {name!r} is not an Edge TPU op"
    if name not in SUPPORTED_OPS:
        return f"op type {name} is not supported by the Edge TPU"
    if name == "DEQUANTIZE":
        return "DEQUANTIZE is supported only at the end of the model"
    for t in op["inputs"] + op["outputs"]:
        label = t["name"] or f"#{t['tensor']}"
        if t["constant"]:
            if t["dtype"] not in _INT8 and t["dtype"] != "int32":
                return f"constant {label} is {t['dtype']} (parameters must be int8/uint8, bias int32)"
            continue
        if t["dtype"] not in _INT8 and not (t["dtype"] == "int16" and t.get("variable") and name in _INT16_STATE_OK):
            return f"tensor {label} is {t['dtype']} (the Edge TPU needs int8/uint8)"
        if "shape_signature" in t:
            return f"tensor {label} has dynamic dims (shape_signature {t['shape_signature']}); sizes must be static"
        if not _outer_dims_ok(t["shape"]):
            return f"tensor {label} has shape {t['shape']}: only the 3 innermost dimensions may be > 1"
    return None


def edgetpu_report(inspection: dict) -> dict:
    """TPU/CPU split, first unsupported op, parameter size and a verdict; see the module doc."""
    summary = inspection["summary"]
    sg = inspection["subgraphs"][0]
    sg_in, sg_out = _io_indices(sg)
    compiled = bool(summary.get("edgetpu_compiled"))
    qerr = summary.get("quantization_errors") or []
    load_error = None
    if qerr and not compiled:  # the compiler runs the model in the TFLite interpreter first
        e = qerr[0]
        load_error = (f"TFLite refuses to load the model: {len(qerr)} tensor(s) with invalid quantization "
                      f"parameters (e.g. {e['name'] or '#' + str(e['tensor'])}: {e['reason']})")
    ops: list[dict] = []
    first: dict | None = None     # the first op left on the CPU; set whenever ``blocked`` is
    blocked = False
    for op in sg["operators"]:
        entry = {"index": op["index"], "op": op["op"]}
        if load_error:
            entry.update(placement="cpu", reason="the model cannot be compiled")
        elif compiled and op["op"] == EDGETPU_OP:
            entry.update(placement="tpu", reason="compiled Edge TPU segment")
        elif (why := _boundary(op, sg_in, sg_out)) is not None:
            entry.update(placement="cpu", boundary=True, reason=why)
        elif blocked and first is not None:
            entry.update(placement="cpu", reason=f"after the first unsupported op #{first['index']}")
        else:
            why = "left on the CPU by the Edge TPU compiler" if compiled else _unsupported(op)
            if why is None:
                entry.update(placement="tpu", reason=SUPPORTED_OPS[op["op"]] or "supported")
            else:
                entry.update(placement="cpu", reason=why)
                if not compiled:  # the compiler partitions once: everything after this runs on the CPU
                    blocked = True
                if first is None:
                    first = {"index": op["index"], "op": op["op"], "reason": why}
        ops.append(entry)

    extra = sum(len(s["operators"]) for s in inspection["subgraphs"][1:])
    tpu = sum(1 for o in ops if o["placement"] == "tpu")
    cpu = len(ops) - tpu + extra
    boundary = sum(1 for o in ops if o.get("boundary"))
    by_type: dict[str, Counter] = {}
    for o in ops:
        by_type.setdefault(o["op"], Counter())[o["placement"]] += 1
    split = {k: {"tpu": v["tpu"], "cpu": v["cpu"]} for k, v in sorted(by_type.items())}

    tpu_idx = {o["index"] for o in ops if o["placement"] == "tpu"}
    if compiled:
        on_tpu_bytes = sum(op.get("custom_options_bytes", 0) for op in sg["operators"] if op["op"] == EDGETPU_OP)
    else:
        seen = {}
        for op in sg["operators"]:
            if op["index"] in tpu_idx:
                for t in op["inputs"]:
                    if t["constant"]:
                        seen[t["tensor"]] = t["nbytes"]
        on_tpu_bytes = sum(seen.values())
    warnings = []
    if inspection["subgraph_count"] > 1:
        warnings.append(f"{inspection['subgraph_count']} subgraphs: the compiler maps only the main one "
                        f"({extra} ops elsewhere run on the CPU)")
    over = on_tpu_bytes > ON_CHIP_BYTES
    if over:
        warnings.append(f"{_mib(on_tpu_bytes)} of Edge TPU parameters exceed the ~8 MiB on-chip memory: "
                        "the rest is streamed from host memory each inference (slower)")
    if load_error:
        warnings.insert(0, load_error)
    fully = first is None and tpu > 0 and extra == 0 and not load_error
    report = {
        "target": "edgetpu",
        "edgetpu_compiled": compiled,
        "fully_mappable": fully,
        "op_count": len(ops) + extra,
        "tpu_ops": tpu,
        "cpu_ops": cpu,
        "boundary_ops": boundary,
        "first_unsupported": first,
        "load_error": load_error,
        "split": split,
        "operators": ops,
        "parameter_bytes": summary["parameter_bytes"],
        "tpu_parameter_bytes": on_tpu_bytes,
        "on_chip_bytes": ON_CHIP_BYTES,
        "exceeds_on_chip_memory": over,
        "warnings": warnings,
    }
    report["verdict"] = _verdict(report)
    return report


def _mib(n: int) -> str:
    return f"{n / 1024 / 1024:.2f} MiB"


def _verdict(r: dict) -> str:
    what = "compiled Edge TPU payload" if r["edgetpu_compiled"] else "of Edge TPU parameters"
    mem = f"; {_mib(r['tpu_parameter_bytes'])} {what} " + (
        "over the ~8 MiB on-chip memory (streamed from host)" if r["exceeds_on_chip_memory"] else "within on-chip memory")
    io = f" ({r['boundary_ops']} float I/O conversion op(s) on the CPU)" if r["boundary_ops"] else ""
    f = r["first_unsupported"]
    if r["edgetpu_compiled"]:
        rest = "nothing else on the CPU" if r["cpu_ops"] == r["boundary_ops"] else \
            f"{r['cpu_ops']} op(s) left on the CPU, first #{f['index']} {f['op']}"
        return f"already compiled for the Edge TPU: {r['tpu_ops']} {EDGETPU_OP} segment(s), {rest}{io}{mem}"
    if r["load_error"]:
        return f"not compilable: {r['load_error']}; all {r['op_count']} ops would run on the CPU"
    if r["fully_mappable"]:
        return f"fully mappable: all {r['tpu_ops']} compute ops can run on the Edge TPU{io}{mem}"
    if f is None:
        return f"not fully mappable: {r['tpu_ops']} of {r['op_count']} ops on the Edge TPU{io}{mem}"
    head = f"op #{f['index']} {f['op']}: {f['reason']}"
    if r["tpu_ops"] == 0:
        return f"not mappable: {head}; all {r['op_count']} ops run on the CPU"
    return (f"partially mappable: {r['tpu_ops']} of {r['op_count']} ops on the Edge TPU; {head}; "
            f"it and everything after it run on the CPU ({r['cpu_ops']} op(s)){mem}")
