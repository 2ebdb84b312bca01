"""``edge-infer import``: wrap an existing quantized TFLite or ONNX model into an artifact."""

from __future__ import annotations

import json
from pathlib import Path

import click

from .cli_common import _guard
from .cli_convert import TaskName


@click.command("import")
@click.argument("model", type=click.Path())
@click.option("-o", "--out", required=True, type=click.Path(), help="Artifact directory to write.")
@click.option("--task", default="image-classification", show_default=True,
              type=TaskName(where=lambda task: task.importable),
              help="The task: a registered one that imports (Task.importable).")
@click.option("--labels", type=click.Path(), help="labels.txt, one label a line (the tasks that take labels: "
                                                   "image-classification, object-detection, semantic-segmentation).")
@click.option("--label-offset", type=int, default=0, show_default=True,
              help="Outputs before the first label (a background class missing from the file).")
@click.option("--resize", type=click.Choice(["bilinear-half-pixel", "bilinear", "nearest", "bicubic"]),
              help="Interpolation (option 'resize'). Default: the task's (bilinear-half-pixel for image "
                   "models, the way Coral's were evaluated).")
@click.option("--scale", help="Normalisation: x = (pixel * scale - mean) / std. A number or a fraction "
                              "(1/255). Default 1/255 once --mean or --std is given.")
@click.option("--mean", help="Normalisation mean, one value or one per channel (0.485,0.456,0.406), "
                             "in units of pixel * scale. Default 0.")
@click.option("--std", help="Normalisation std, one value or one per channel. Default 1.")
@click.option("--letterbox/--stretch", "letterbox", default=None,
              help="Fit the image keeping its aspect ratio, padding the rest (--letterbox), or scale each axis "
                   "to the input size (--stretch) (option 'resize_mode'). Default: the task's.")
@click.option("--pad", type=click.IntRange(0, 255), help="Letterbox padding value, 0..255 (option 'pad'; "
                                                         "YOLO: 114).")
@click.option("--pad-position", type=click.Choice(["top-left", "center"]),
              help="Where the letterboxed image sits: top-left (YOLOX; padding right/bottom) or center "
                   "(Ultralytics) (option 'pad_position').")
@click.option("--channel-order", type=click.Choice(["RGB", "BGR"], case_sensitive=False),
              help="The model's channel order; BGR for OpenCV-trained models (option 'channel_order'). "
                   "--mean/--std are in this order.")
@click.option("--family", help="Detector family, the decoder of its outputs (object-detection: ssd-postprocess, "
                               "yolo, yolox, gfl; default: inferred from the output shapes).")
@click.option("--postprocess", "postprocess", metavar="JSON",
              help="Decode parameters as a JSON object, merged over the family's defaults "
                   "('{\"score_threshold\": 0.3}').")
@click.option("--name", help="Model name (default: file stem).")
@click.option("--model-version", default="1", show_default=True)
@click.option("--force", is_flag=True, help="Replace an existing output directory.")
@click.option("--json", "as_json", is_flag=True)
@_guard
def import_cmd(model, out, task, labels, label_offset, resize, scale, mean, std, letterbox, pad, pad_position,
               channel_order, family, postprocess, name, model_version, force, as_json):
    """Wrap MODEL (.tflite, or .onnx already quantized) into an artifact: hashed, I/O and pre-processing recorded.

    \b
    Examples:
      edge-infer import mobilenet_v2_1.0_224_quant.tflite -o out/mnv2 --labels imagenet_labels.txt
      edge-infer import mobilenet_v2_quantized_1x3x224x224.tflite -o out/mnv2-int8 --labels labels.txt \\
          --scale 1/255 --mean 0.485,0.456,0.406 --std 0.229,0.224,0.225
      edge-infer import yolov8n_full_integer_quant.tflite -o out/yolo --task tensors
      edge-infer import yolov8n_full_integer_quant.tflite -o out/yolo --task object-detection --family yolo \\
          --scale 1/255 --letterbox --pad 114 --pad-position center --labels coco80.txt
      edge-infer import yolov8n_int8.onnx -o out/yolo-ort --task object-detection --family yolo \\
          --scale 1/255 --letterbox --pad 114 --pad-position center \\
          --postprocess '{"score_threshold": 0.3}'

    \b
    Normalisation: the model sees x = (pixel * scale - mean) / std, quantized with its
    input tensor's own scale and zero point. Without --scale/--mean/--std: a uint8
    input takes the pixels as they are (Coral's convention); int8 and float32 inputs
    take [-1, 1] (pixel / 127.5 - 1), with a warning for int8 naming the range its
    input quantization covers. A normalisation that the input quantization would clip
    is refused (exit 2).

    \b
    An image classifier has one image input and one [1, C] or [C] score output;
    detectors, segmenters and pose models are refused with the task that fits
    (or import them with --task tensors: outputs dequantized, raw ones kept).
    A flag the task does not read (--family for a classifier, say) is refused
    (exit 2) naming the ones it reads.

    \b
    An .onnx model runs on onnxruntime: quantized ones (dynamic ConvInteger/
    MatMulInteger, QDQ, QLinear*) as onnx-int8, the quantization recorded as
    found; a float one is imported as onnx-fp32 with a warning (edge-infer
    convert makes int8 from it). A dynamic batch dimension is run as 1; other
    dynamic dimensions are refused.
    """
    from edge_runtime.converters.import_common import import_model

    options = {"resize_mode": None if letterbox is None else ("letterbox" if letterbox else "stretch"),
               "pad": pad, "pad_position": pad_position, "channel_order": channel_order, "family": family,
               "postprocess": postprocess}
    man = import_model(Path(model), Path(out), task=task, labels=Path(labels) if labels else None,
                       label_offset=label_offset, name=name, version=model_version, force=force, resize=resize,
                       scale=scale, mean=mean, std=std, **{k: v for k, v in options.items() if v is not None})
    v = man["variants"][0]
    b = v["buckets"][0]
    summary = {"artifact": str(out), "target": v["target"], "input": b["inputs"][0], "outputs": b["outputs"],
               "preprocess": man["preprocess"], "postprocess": man["postprocess"],
               "warnings": man["model"]["source"].get("warnings", [])}
    if man["postprocess"].get("family") or family:
        summary["family"] = man["postprocess"].get("family") or family
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    else:
        i = b["inputs"][0]
        click.echo(f"{v['target']}: input {i['name']} {i['dtype']}{i['shape']}"
                   f"{' (+%d more)' % (len(b['inputs']) - 1) if len(b['inputs']) > 1 else ''}, "
                   f"{len(b['outputs'])} output(s); wrote {out}")
        post = man["postprocess"]
        if post.get("family") or family or postprocess:
            shown = {k: val for k, val in post.items() if k not in ("family", "labels")}
            click.echo(f"  family {post.get('family') or family or '-'}"
                       + (f", postprocess {json.dumps(shown, sort_keys=True)}" if shown else ""))
