"""``torch.export`` programs (``.pt2``, ``torch.export.save``) as a coreml source,
and their ``w8a8`` route.

Kind of a torch source file, from its zip archive rather than its suffix
(``source_kind``): ``<root>/archive_format`` holding ``pt2`` is a
``torch.export`` program; ``<root>/data.pkl`` with ``<root>/code/`` is
TorchScript; anything else (not a zip, a ``torch.save`` pickle) is neither.

Per bucket the program is re-exported at the bucket's static shapes
(``static_program``: ``torch.export.export(program.module(), example)``), its
decompositions run (``run_decompositions({})``, as coremltools asks) and
``ct.convert`` reads it directly.

``w8a8``: coremltools 9's PT2E quantizer (``CoreMLQuantizer``) imports
``torch.ao.quantization.quantizer``, which torch 2.13 no longer has (PT2E moved
to ``torchao``), so the program goes through the FX ``LinearQuantizer``
instead: every ``aten.linear`` / ``aten.conv2d`` call of the exported graph
becomes an ``nn.Linear`` / ``nn.Conv2d`` submodule over the same parameters
(``lift_linears``), which the FX quantizer knows. Then, on the calibration feeds:

1. SmoothQuant (``smooth``, alpha 0.8 as the onnx-int8 transformer recipe):
   for the linears fed by a LayerNorm or GELU output (a BERT's activation
   outliers), a float ``mul`` by 1/s in front and weights' input columns by s,
   s = max|x|^a / max|W|^(1-a) per channel. The float model is unchanged
   (to float rounding);
2. ``LinearQuantizer``: int8 per-channel weights, uint8/int8 per-tensor
   activations at every linear/conv *input*. A linear/conv *output* whose
   fake-quantizer is no layer's input quantizer stays in the compute precision
   (the node is removed): a per-tensor scale over the residual stream's outlier
   channels (up to 190 in MiniLM) wipes out the rest (embedding cosine 0.87
   with them);
3. the linears fed by a GELU (``FLOAT_INPUTS``: a BERT's FFN down-projection,
   kept float by the onnx-int8 ``transformer`` recipe too) keep float inputs
   and int8 weights, named in the record; the spec validation allows exactly
   that many. MiniLM on the fake-quantized model, with them int8 / float:
   embedding cosine 0.9963 / 0.9987, classifier SST-2 agreement 0.9828 / 0.9920;
4. observers only (standard PTQ calibration), then frozen; the fake-quantized
   model is the Linux parity stand-in, ``finalize`` the model converted (the
   two are compared on 4 feeds: ``fake_quant_vs_finalized``).

Quantization scheme: ``affine`` (zero points) by default on this route, not
coremltools' ``symmetric`` default: on MiniLM's fake-quantized model it
measured classifier agreement 0.9943 against 0.9920 (the budget is 0.99: 5
flipped SST-2 sentences instead of 7, where 9 would fail) and embedding cosine
0.9991 / 0.9884 against 0.9987 / 0.9873. Whether the Neural Engine runs
either faster was never measured (no Apple hardware);
``{"quantization_scheme": "symmetric"}`` switches back.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

from .registry import ConversionFailed

SMOOTH_ALPHA = 0.8
SCHEME = "affine"      # activations and weights with zero points (see the module doc)
_SMOOTHED_BY = ("layer_norm", "gelu")
# linears fed by these ops keep float inputs (int8 weights): the FFN down-projection, float in
# the onnx-int8 `transformer` recipe too (its GELU output has the widest range of the block)
FLOAT_INPUTS = ("gelu",)


def source_kind(path: Path) -> str:
    """'export' | 'torchscript'; ConversionFailed naming the file when it is neither."""
    path = Path(path)
    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
            fmt = [n for n in names if n.count("/") == 1 and n.endswith("/archive_format")]
            if fmt and z.read(fmt[0]).strip() == b"pt2":
                return "export"
    except (zipfile.BadZipFile, OSError) as exc:
        raise ConversionFailed(f"torch source {path.name} is neither TorchScript nor a torch.export program "
                               f"(.pt2): not a zip archive ({type(exc).__name__})") from None
    roots = {n.split("/", 1)[0] for n in names if "/" in n}
    if any(f"{r}/data.pkl" in names and any(n.startswith(f"{r}/code/") for n in names) for r in roots):
        return "torchscript"
    what = "a torch.save pickle (no code/)" if any(n.endswith("/data.pkl") for n in names) else "an unknown zip"
    raise ConversionFailed(f"torch source {path.name} is neither TorchScript nor a torch.export program (.pt2): "
                           f"{what}")


def load_program(path: Path):
    """The saved ExportedProgram (not yet specialised to a bucket)."""
    import torch

    try:
        with open(path, "rb") as f:       # a buffer: torch.export.load wants a .pt2 suffix on a path
            return torch.export.load(f)
    except Exception as exc:  # noqa: BLE001 - any load failure: a bad or foreign archive
        raise ConversionFailed(f"torch source {Path(path).name} does not load as a torch.export program: "
                               f"{type(exc).__name__}: {str(exc)[:200]}") from None


def static_program(module, example: tuple, names: list[str]):
    """``module`` exported at the example's static shapes, decompositions run (what ct.convert reads)."""
    import torch

    try:
        program = torch.export.export(module, example).run_decompositions({})
    except Exception as exc:  # noqa: BLE001
        raise ConversionFailed(f"torch.export could not specialise the program to shapes "
                               f"{[tuple(x.shape) for x in example]}: {type(exc).__name__}: {str(exc)[:300]}") from None
    got = [s.arg.name for s in program.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    if got != names:
        raise ConversionFailed(f"the torch.export program's inputs are {got}, the ONNX source's {names}")
    return program


def _attr(gm, target: str):
    import torch

    value = gm.get_submodule(target.rpartition(".")[0]) if "." in target else gm
    value = getattr(value, target.rpartition(".")[2])
    return value if isinstance(value, torch.nn.Parameter) else torch.nn.Parameter(value, requires_grad=False)


def lift_linears(gm):
    """A plain fx.GraphModule over ``gm``'s graph (an ``ExportedProgram.module()``), every
    ``aten.linear`` / ``aten.conv2d`` over parameters, and ``aten.matmul`` by a constant
    matrix, turned into an ``nn.Linear`` / ``nn.Conv2d`` submodule (what the FX quantizer
    matches)."""
    import torch
    from torch import fx

    matmul = torch.ops.aten.matmul.default
    graph = gm.graph
    graph.set_codegen(fx.graph.CodeGen())           # no pytree in/out spec: plain positional inputs
    for node in list(graph.nodes):
        if node.op == "call_module" and not node.users:     # export's _guards_fn
            graph.erase_node(node)
    for i, node in enumerate(list(graph.nodes)):
        if node.op != "call_function" or node.target not in (torch.ops.aten.linear.default, matmul,
                                                              torch.ops.aten.conv2d.default):
            continue
        x, w, *rest = node.args
        b = rest[0] if rest else None
        if w.op != "get_attr" or (b is not None and b.op != "get_attr"):
            continue                                 # over a computed weight: stays as it is
        weight = _attr(gm, w.target)
        if node.target is matmul:                   # x @ C, C a constant matrix: a linear over C^T
            if weight.dim() != 2:
                continue
            weight = torch.nn.Parameter(weight.detach().t().contiguous(), requires_grad=False)
            kind, lin = "linear", torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
        elif node.target is torch.ops.aten.linear.default:
            kind, lin = "linear", torch.nn.Linear(weight.shape[1], weight.shape[0], bias=b is not None)
        else:
            stride, padding, dilation, groups = (list(rest[1:]) + [1, 0, 1, 1][len(rest[1:]):])[:4]
            kind = "conv"
            lin = torch.nn.Conv2d(weight.shape[1] * groups, weight.shape[0], tuple(weight.shape[2:]), stride=stride,
                                  padding=padding, dilation=dilation, groups=groups, bias=b is not None)
        lin.weight = weight
        if b is not None:
            lin.bias = _attr(gm, b.target)
        owner = w.target.rpartition(".")[0] if node.target is not matmul else ""   # W's module gets the child
        target = f"{owner}.{kind}" if owner else f"{kind}_{i}"
        (gm.get_submodule(owner) if owner else gm).add_module(kind if owner else target, lin)
        with graph.inserting_before(node):
            new = graph.call_module(target, (x,))
        node.replace_all_uses_with(new)
        graph.erase_node(node)
    graph.eliminate_dead_code()
    lifted = fx.GraphModule(gm, graph)       # copies what the graph references, nothing else
    lifted.graph.lint()
    return lifted.eval()


def _matches(node, ops) -> bool:
    return node.op == "call_function" and any(f"aten.{o}." in str(node.target) for o in ops)


def smooth(gm, examples: list[tuple], alpha: float = SMOOTH_ALPHA, skip=()) -> int:
    """SmoothQuant on the linears fed by LayerNorm/GELU, not by ``skip`` ops (in place);
    returns the groups smoothed."""
    import torch

    amax: dict = {}

    def hook(name):
        def record(_, args):
            a = args[0].detach().abs().reshape(-1, args[0].shape[-1]).amax(0)
            amax[name] = torch.maximum(amax[name], a) if name in amax else a
        return record

    linears = {n: m for n, m in gm.named_modules() if isinstance(m, torch.nn.Linear)}
    handles = [m.register_forward_pre_hook(hook(n)) for n, m in linears.items()]
    try:
        with torch.no_grad():
            for ex in examples:
                gm(*ex)
    finally:
        for h in handles:
            h.remove()
    consumers: dict = {}
    for node in gm.graph.nodes:
        if node.op == "call_module" and node.target in linears:
            consumers.setdefault(node.args[0], []).append(node)
    graph, k = gm.graph, 0
    for x, users in consumers.items():
        if not _matches(x, _SMOOTHED_BY) or _matches(x, skip):
            continue
        mods = [linears[u.target] for u in users]
        w = torch.stack([m.weight.detach().abs().amax(0) for m in mods]).amax(0)
        s = (amax[users[0].target].clamp(min=1e-5) ** alpha / w.clamp(min=1e-5) ** (1 - alpha)).clamp(min=1e-5)
        with torch.no_grad():
            for m in mods:
                m.weight.mul_(s[None, :])
        gm.register_buffer(f"smoothquant_{k}", (1.0 / s).contiguous())
        with graph.inserting_after(x):
            attr = graph.get_attr(f"smoothquant_{k}")
        with graph.inserting_after(attr):
            mul = graph.call_function(torch.ops.aten.mul.Tensor, (x, attr))
        for u in users:
            u.replace_input_with(x, mul)
        k += 1
    gm.recompile()
    return k


def _first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


def calibrate_w8a8(gm, examples: list[tuple], overrides: dict):
    """(fake-quantized model with frozen observers, finalized model, record) for a lifted graph."""
    import torch
    from coremltools.optimize.torch.quantization import LinearQuantizer, LinearQuantizerConfig

    alpha = float(overrides.get("smoothquant_alpha", SMOOTH_ALPHA))
    scheme = overrides.get("quantization_scheme", SCHEME)
    keep = overrides.get("w8a8_float_inputs", ",".join(FLOAT_INPUTS))
    keep = tuple(o.strip() for o in str(keep).split(",") if o.strip())
    groups = smooth(gm, examples, alpha, skip=keep) if alpha > 0 else 0
    cfg = LinearQuantizerConfig.from_dict({"global_config": {
        "quantization_scheme": scheme,
        "milestones": [0, 0, 1 << 30, 1 << 30]}})
    quantizer = LinearQuantizer(gm, cfg)
    try:
        prepared = quantizer.prepare(example_inputs=examples[0])
    except Exception as exc:  # noqa: BLE001 - FX tracing / pattern matching failures
        raise ConversionFailed(f"coremltools.optimize.torch could not prepare the program for w8a8: "
                               f"{type(exc).__name__}: {str(exc)[:300]}") from None
    layers = (torch.nn.Linear, torch.nn.Conv2d)

    def is_fq(n):
        return n.op == "call_module" and "activation_post_process" in str(n.target)

    def quantizes_a_layer_input(fq) -> bool:   # reaches a linear/conv before another fake-quantizer
        todo, seen = list(fq.users), set()
        while todo:
            n = todo.pop()
            if n in seen or is_fq(n):
                continue
            seen.add(n)
            if n.op == "call_module" and isinstance(prepared.get_submodule(n.target), layers):
                return True
            todo.extend(n.users)
        return False

    dropped = 0
    for node in list(prepared.graph.nodes):    # linear outputs stay float (see the module doc)
        src = node.args[0] if node.args else None
        if (is_fq(node) and src is not None and getattr(src, "op", None) == "call_module"
                and isinstance(prepared.get_submodule(src.target), layers) and not quantizes_a_layer_input(node)):
            node.replace_all_uses_with(src)
            prepared.graph.erase_node(node)
            dropped += 1
    kept_float = []
    for node in list(prepared.graph.nodes):    # the recipe's float-input layers: their input fq removed
        src = node.args[0] if node.args else None
        if is_fq(node) and src is not None and _matches(src, keep):
            kept_float += [u.target for u in node.users if u.op == "call_module"
                           and isinstance(prepared.get_submodule(u.target), layers)]
            node.replace_all_uses_with(src)
            prepared.graph.erase_node(node)
    prepared.graph.eliminate_dead_code()
    prepared.delete_all_unused_submodules()
    prepared.recompile()
    prepared.eval()
    prepared.apply(torch.ao.quantization.enable_observer)
    prepared.apply(torch.ao.quantization.disable_fake_quant)
    with torch.no_grad():
        for ex in examples:
            prepared(*ex)
    prepared.apply(torch.ao.quantization.disable_observer)
    prepared.apply(torch.ao.quantization.enable_fake_quant)
    finalized = quantizer.finalize(prepared, inplace=False)
    with torch.no_grad():      # what is converted vs what parity is measured on: rounding apart, the same
        pairs = [(_first(prepared(*ex)), _first(finalized(*ex))) for ex in examples[:4]]
    diff = max(float((a - b).abs().max()) for a, b in pairs)
    scale = max(float(a.abs().max()) for a, _ in pairs)
    with torch.no_grad():      # the stand-in: weights fake-quantized once, not on every call (same values)
        for m in prepared.modules():
            if hasattr(m, "weight_fake_quant") and isinstance(getattr(m, "weight", None), torch.Tensor):
                m.weight = torch.nn.Parameter(m.weight_fake_quant(m.weight).detach(), requires_grad=False)
                m.weight_fake_quant.disable_fake_quant()
    record = {"linear_lifting": "aten.linear/conv2d -> nn.Linear/Conv2d for the FX LinearQuantizer (coremltools' "
                                "PT2E CoreMLQuantizer needs torch.ao.quantization.quantizer, absent from torch 2.13)",
              "smoothquant": {"alpha": alpha, "groups": groups},
              "quantization_scheme": scheme,
              "linear_outputs": f"float ({dropped} output fake-quantizers removed)",
              "float_input_layers": {"after": list(keep), "layers": kept_float,
                                     "why": "int8 weights, inputs in the compute precision (the onnx-int8 "
                                            "transformer recipe's FFN2 rule)"},
              "calibration": "observers only, then frozen",
              "fake_quant_vs_finalized": {"max_abs_diff": diff, "relative": diff / max(scale, 1e-6),
                                          "samples": len(pairs)}}
    return prepared, finalized, record
