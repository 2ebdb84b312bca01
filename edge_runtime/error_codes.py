"""Every error code, once: a ``Final`` constant each, and the table ``CODES``.

A code is the stable string an ``EdgeRuntimeError`` carries in ``err.code``
(also in the CLI's JSON output, ``score``'s output lines and the metrics).
Raise sites name codes through these constants (``code=ec.INPUT_TOO_LONG``),
never as literals; ``tests/test_error_codes.py`` checks that, that each entry
is used, that its layer is the class it is raised with, and that README's
"Error codes" table is this one (``python -m edge_runtime.error_table``
prints it: the rendering lives there).

The layer is the error class's (a subclass counts as its base), and gives the
exit code of ``edge-infer``. ``also`` names the other layers a code is raised
under where the raise site picks the class by where the value came from.

This module imports nothing from the project but ``value`` (``errors.py`` imports it).
"""

from __future__ import annotations

from typing import Final

from .value import Frozen

# layer -> exit code: input is the caller's, artifact and device the operator's, timeout and runtime ours
LAYERS: Final = {"input": 2, "artifact": 3, "device": 4, "timeout": 5, "runtime": 6, "parity": 7, "other": 1}


class Code(Frozen):
    code: str
    layer: str                  # a key of LAYERS: the class the code is raised with
    meaning: str                # one line for the person who got it
    also: tuple[str, ...]       # other layers, where the raise site picks the class by context

    def __init__(self, code: str, layer: str, meaning: str, also: tuple[str, ...] = ()) -> None:
        d = self.__dict__
        d["code"], d["layer"], d["meaning"], d["also"] = code, layer, meaning, also

    @property
    def layers(self) -> tuple[str, ...]:
        return (self.layer, *self.also)

    @property
    def exits(self) -> tuple[int, ...]:
        return tuple(LAYERS[layer] for layer in self.layers)


CODES: dict[str, Code] = {}


def _code(code: str, layer: str, meaning: str, also: tuple[str, ...] = ()) -> str:
    if code in CODES or layer not in LAYERS or not set(also) <= set(LAYERS) or "|" in meaning:
        raise ValueError(f"bad error code entry {code!r}")
    CODES[code] = Code(code, layer, meaning, also)
    return code


# -- input: the caller's (InputError, exit 2) -------------------------------------------------------
INPUT_INVALID: Final = _code("input_invalid", "input", "The input or an option was rejected; the message says why.")
INPUT_MISSING: Final = _code("input_missing", "input", "No input was given, or the input path does not exist.")
INPUT_EMPTY: Final = _code("input_empty", "input", "The text or image is empty.")
INPUT_WRONG_TYPE: Final = _code("input_wrong_type", "input",
                                "The input is not a kind of value this artifact's task takes.")
INPUT_WRONG_SHAPE: Final = _code("input_wrong_shape", "input", "An array's shape fits no bucket of the model.")
INPUT_WRONG_DTYPE: Final = _code("input_wrong_dtype", "input",
                                 "An array's element type is not the one the model takes.")
INPUT_WRONG_NAMES: Final = _code("input_wrong_names", "input", "The arrays given are not named as the model's inputs.")
INPUT_NONFINITE: Final = _code("input_nonfinite", "input", "An array holds NaN or infinity.")
INPUT_OUT_OF_RANGE: Final = _code("input_out_of_range", "input",
                                  "An array holds values the model's type cannot: an integer outside its "
                                  "type, a float past float16/float32's range, a bool input's value other "
                                  "than 0/1.")
INPUT_TOO_LARGE: Final = _code("input_too_large", "input", "The request, file, line or image is over its byte limit.")
INPUT_TOO_LONG: Final = _code("input_too_long", "input", "The text is over the max_text_chars limit.")
INPUT_TOO_MANY_PIXELS: Final = _code("input_too_many_pixels", "input",
                                     "The image is over max_image_pixels (read from its header, before decoding).")
INPUT_TOO_DEEP: Final = _code("input_too_deep", "input", "The JSON input is nested deeper than max_json_depth.")
INPUT_BATCH_TOO_LARGE: Final = _code("input_batch_too_large", "input", "The batch has more items than max_batch_items.")
INPUT_UNDECODABLE: Final = _code("input_undecodable", "input",
                                 "The image is not a decodable PNG, JPEG or BMP, or is truncated.")
INPUT_BAD_ENCODING: Final = _code("input_bad_encoding", "input", "The text is not valid UTF-8 or Unicode.")
INPUT_BAD_JSON: Final = _code("input_bad_json", "input",
                              "A JSON file, line or option value does not parse as expected, or names "
                              "a key twice.")
INPUT_BAD_CSV: Final = _code("input_bad_csv", "input", "A CSV input's header or a row cannot be read.")
INPUT_BAD_FILE: Final = _code("input_bad_file", "input",
                              "A .npy/.npz input is unreadable, holds more than plain arrays (pickles "
                              "are refused) or holds an array name twice.")
INPUT_FILE_UNREADABLE: Final = _code("input_file_unreadable", "input",
                                     "An input file cannot be read (permissions, or not a regular file).")
INPUT_FIELD_MISSING: Final = _code("input_field_missing", "input",
                                   "A JSONL/CSV record has no value for the field or column asked for.")
LIMIT_UNKNOWN: Final = _code("limit_unknown", "input", "A limit key is not one this runtime knows (in a manifest: "
                             "the artifact's).", also=("artifact",))
LIMIT_INVALID: Final = _code("limit_invalid", "input", "A limit or deadline is not a positive number, or is over "
                             "its ceiling (limits.CEILINGS; in a manifest: the artifact's).", also=("artifact",))
LIMIT_RAISE_REFUSED: Final = _code("limit_raise_refused", "input",
                                   "A per-call limit may lower a limit, never raise it.")
DEVICE_OPTION_INVALID: Final = _code("device_option_invalid", "input", "A device option's value is not one the backend "
                                     "takes (from an environment variable: the operator's).", also=("device",))
DEVICE_OPTION_UNKNOWN: Final = _code("device_option_unknown", "input",
                                     "The backend declares no device option of that name.")
TASK_UNKNOWN: Final = _code("task_unknown", "input", "No task is registered under that name.")
TASK_SAMPLES_UNSUPPORTED: Final = _code("task_samples_unsupported", "input",
                                        "The task has no sample loader, so it cannot be converted.")

# convert
CONVERT_REQUEST_INVALID: Final = _code("convert_request_invalid", "input", "A convert option is out of its range.")
CONVERT_TASK_UNKNOWN: Final = _code("convert_task_unknown", "input", "convert --task names no registered task.")
CONVERT_TARGET_UNKNOWN: Final = _code("convert_target_unknown", "input",
                                      "No converter is registered for that --target.")
CONVERT_NO_TARGET: Final = _code("convert_no_target", "input",
                                 "No --target was given, or none asked for can be built here.")
CONVERT_TARGET_UNAVAILABLE: Final = _code("convert_target_unavailable", "input", "A --target's toolchain is not "
                                          "installed here (--allow-skip leaves the target out).")
CONVERT_TARGET_FAILED: Final = _code("convert_target_failed", "input",
                                     "The toolchain could not build a target, or the built model failed to run.")
CONVERT_SOURCE_MISSING: Final = _code("convert_source_missing", "input",
                                      "The source model or --torch-source does not exist.")
CONVERT_SOURCE_UNREADABLE: Final = _code("convert_source_unreadable", "input",
                                         "The source is not a readable float ONNX model.")
CONVERT_SOURCE_TFLITE: Final = _code("convert_source_tflite", "input",
                                     "The source is a TFLite model: use edge-infer import.")
CONVERT_SOURCE_QUANTIZED: Final = _code("convert_source_quantized", "input",
                                        "The source is already quantized: convert its float original.")
CONVERT_SOURCE_OPSET: Final = _code("convert_source_opset", "input",
                                    "The source's ONNX opset is too old for int8 and cannot be upgraded faithfully.")
CONVERT_SHAPE_DYNAMIC: Final = _code("convert_shape_dynamic", "input",
                                     "The source has dynamic dimensions: fix them with --input-shape.")
CONVERT_SHAPE_INVALID: Final = _code("convert_shape_invalid", "input",
                                     "An --input-shape is malformed or cannot be applied to the model.")
CONVERT_BUCKETS_INVALID: Final = _code("convert_buckets_invalid", "input",
                                       "--buckets are not positive integers, or the task has no sequence buckets.")
CONVERT_MIN_PARITY_INVALID: Final = _code("convert_min_parity_invalid", "input", "--min-parity is not in (0, 1].")
CONVERT_CALIBRATION_MISSING: Final = _code("convert_calibration_missing", "input",
                                           "The --calibration or --parity-data path does not exist.")
CONVERT_CALIBRATION_INVALID: Final = _code("convert_calibration_invalid", "input",
                                           "Calibration or parity data the task cannot read, or none fits the model.")
CONVERT_CALIBRATION_SMALL: Final = _code("convert_calibration_small", "input",
                                         "The calibration data is too small to hold parity samples out.")
CONVERT_TOO_FEW_SAMPLES: Final = _code("convert_too_few_samples", "input",
                                       "Fewer calibration or parity samples than asked for (see --allow-few-samples).")
CONVERT_TOKENIZER_MISSING: Final = _code("convert_tokenizer_missing", "input", "The task needs --tokenizer.")
CONVERT_LABELS_UNUSED: Final = _code("convert_labels_unused", "input", "--labels was given to a task that takes none.")
CONVERT_PREPROCESS_MISSING: Final = _code("convert_preprocess_missing", "input", "The task needs --preprocess.")
CONVERT_PREPROCESS_INVALID: Final = _code("convert_preprocess_invalid", "input",
                                          "A --preprocess key or value the task cannot use.")
CONVERT_RECIPE_INVALID: Final = _code("convert_recipe_invalid", "input",
                                      "--recipe or --recipe-override names or sets something no target takes.")
CONVERT_OUT_EXISTS: Final = _code("convert_out_exists", "input",
                                  "The output path exists and is not an empty directory (--force overwrites).")

# import
IMPORT_TASK_UNSUPPORTED: Final = _code("import_task_unsupported", "input", "edge-infer import does not take that task.")
IMPORT_MODEL_MISSING: Final = _code("import_model_missing", "input", "The .tflite model to import does not exist.")
IMPORT_MODEL_TOO_LARGE: Final = _code("import_model_too_large", "input",
                                      "The .tflite model is over the import size cap.")
IMPORT_MODEL_UNSUPPORTED: Final = _code("import_model_unsupported", "input",
                                        "The model's inputs are not ones the task can feed.")
IMPORT_TASK_MISMATCH: Final = _code("import_task_mismatch", "input",
                                    "The model's outputs are another task's than the one asked for.")
IMPORT_SHAPE_DYNAMIC: Final = _code("import_shape_dynamic", "input",
                                    "The model has dynamic dimensions; artifacts are static-shape.")
IMPORT_NO_INTERPRETER: Final = _code("import_no_interpreter", "input",
                                     "No TFLite interpreter is installed to read the model.")
IMPORT_LABELS_UNUSED: Final = _code("import_labels_unused", "input",
                                    "--labels or --label-offset given where they do not apply.")
IMPORT_LABELS_UNREADABLE: Final = _code("import_labels_unreadable", "input", "The --labels file cannot be read.")
IMPORT_LABELS_MISMATCH: Final = _code("import_labels_mismatch", "input",
                                      "The labels, shifted by --label-offset, do not match the model's classes.")
IMPORT_PREPROCESS_INVALID: Final = _code("import_preprocess_invalid", "input",
                                         "--scale, --mean or --std is not a valid value for the input.")
IMPORT_PREPROCESS_UNUSED: Final = _code("import_preprocess_unused", "input",
                                        "Pre-processing flags were given to a task that takes none.")
IMPORT_NORMALISATION_CLIPS: Final = _code("import_normalisation_clips", "input",
                                          "The normalisation would clip pixels outside the input's quantized range.")
IMPORT_OUT_NOT_A_DIRECTORY: Final = _code("import_out_not_a_directory", "input",
                                          "The -o path is a file, or no directory can be made there.")
IMPORT_FORMAT_UNSUPPORTED: Final = _code("import_format_unsupported", "input",
                                         "The model file is not a format import reads (.tflite, .onnx).")
IMPORT_POSTPROCESS_INVALID: Final = _code("import_postprocess_invalid", "input",
                                          "--postprocess is not a JSON object.")
IMPORT_NO_ONNX: Final = _code("import_no_onnx", "input",
                              "onnx or onnxruntime is not installed to read the ONNX model to import.")

# eval
EVAL_DATA_MISSING: Final = _code("eval_data_missing", "input", "The evaluation data does not exist.")
EVAL_DATA_UNREADABLE: Final = _code("eval_data_unreadable", "input", "The evaluation data cannot be read.")
EVAL_DATA_EMPTY: Final = _code("eval_data_empty", "input", "The evaluation data holds no labelled samples.")
EVAL_NOTHING_EVALUATED: Final = _code("eval_nothing_evaluated", "input",
                                      "Every evaluation row was skipped: nothing was evaluated.")
EVAL_ROWS_SKIPPED: Final = _code("eval_rows_skipped", "input", "Rows were skipped and --fail-on-skip was given.")

# score
SCORE_INPUT_EMPTY: Final = _code("score_input_empty", "input", "The score input held no records.")
SCORE_OPTIONS_CONFLICT: Final = _code("score_options_conflict", "input",
                                      "score options that exclude each other (--resume with --force or stdout).")
SCORE_OUTPUT_EXISTS: Final = _code("score_output_exists", "input",
                                   "The output file exists: pass --resume or --force.")
SCORE_OUTPUT_CORRUPT: Final = _code("score_output_corrupt", "input",
                                    "The output or its job record to resume is not score's; start over with --force.")
SCORE_OUTPUT_MISMATCH: Final = _code("score_output_mismatch", "input",
                                     "The output to resume was written for another input, model or options.")
SCORE_RESUME_UNVERIFIABLE: Final = _code("score_resume_unverifiable", "input",
                                         "The output to resume has no job record to prove it is this job's.")

# -- artifact: the operator's (ArtifactError, exit 3) -----------------------------------------------
ARTIFACT_INVALID: Final = _code("artifact_invalid", "artifact", "The artifact was refused; the message names the file.")
ARTIFACT_MISSING: Final = _code("artifact_missing", "artifact", "The artifact directory or model file does not exist.")
ARTIFACT_NOT_DIRECTORY: Final = _code("artifact_not_directory", "artifact", "The artifact path is not a directory.")
ARTIFACT_FILE_MISSING: Final = _code("artifact_file_missing", "artifact",
                                     "The manifest, or a file it lists, is missing.")
ARTIFACT_FILE_UNLISTED: Final = _code("artifact_file_unlisted", "artifact",
                                      "A package directory's files are not exactly those the manifest lists.")
ARTIFACT_FILE_UNREADABLE: Final = _code("artifact_file_unreadable", "artifact",
                                        "A file of the artifact cannot be read.")
ARTIFACT_FILE_INVALID: Final = _code("artifact_file_invalid", "artifact",
                                     "A file of the artifact is not a file, not text, or does not load.")
ARTIFACT_HASH_MISMATCH: Final = _code("artifact_hash_mismatch", "artifact",
                                      "A file's size or sha256 differs from the manifest: corrupted or tampered with.")
ARTIFACT_PATH_ESCAPES: Final = _code("artifact_path_escapes", "artifact",
                                     "A path or symlink points outside the artifact directory.")
ARTIFACT_PATH_INVALID: Final = _code("artifact_path_invalid", "artifact",
                                     "A file path in the manifest is malformed or cannot be resolved.")
ARTIFACT_VARIANT_MISSING: Final = _code("artifact_variant_missing", "artifact",
                                        "The artifact has no variant for the target asked for.")
ARTIFACT_TARGET_UNKNOWN: Final = _code("artifact_target_unknown", "artifact",
                                       "A variant's target is one no installed device backend knows.")
ARTIFACT_TASK_MISMATCH: Final = _code("artifact_task_mismatch", "artifact",
                                      "The model does not fit the artifact's task.")
ARTIFACT_LABELS_MISMATCH: Final = _code("artifact_labels_mismatch", "artifact",
                                        "The labels file does not match the model's number of classes.")
ARTIFACT_TOO_LARGE: Final = _code("artifact_too_large", "artifact", "The model file is over the size cap.")
ARTIFACT_UNREADABLE: Final = _code("artifact_unreadable", "artifact", "The model file cannot be read.")
ARTIFACT_NOT_TFLITE: Final = _code("artifact_not_tflite", "artifact", "The file is not a TFLite model.")
ARTIFACT_CORRUPT: Final = _code("artifact_corrupt", "artifact", "The TFLite model is malformed or truncated.")
IMPORT_MODEL_INVALID: Final = _code("import_model_invalid", "artifact",
                                    "The TFLite interpreter refuses the model to import.")
IMPORT_ONNX_INVALID: Final = _code("import_onnx_invalid", "artifact",
                                   "ONNX Runtime refuses the ONNX model to import, or it keeps external data.")
MANIFEST_TOO_LARGE: Final = _code("manifest_too_large", "artifact", "The manifest is over its size limit.")
MANIFEST_UNPARSABLE: Final = _code("manifest_unparsable", "artifact", "The manifest is not valid JSON.")
MANIFEST_DUPLICATE_KEY: Final = _code("manifest_duplicate_key", "artifact", "The manifest repeats a key.")
MANIFEST_UNSEALED: Final = _code("manifest_unsealed", "artifact", "The manifest carries no seal (hand-written or old).")
MANIFEST_SEAL_MISMATCH: Final = _code("manifest_seal_mismatch", "artifact",
                                      "The manifest's content does not match its seal: corrupted or edited.")
MANIFEST_FORMAT_UNKNOWN: Final = _code("manifest_format_unknown", "artifact",
                                       "The directory is not an edge-runtime artifact.")
MANIFEST_VERSION_UNKNOWN: Final = _code("manifest_version_unknown", "artifact",
                                        "The artifact's format version is one this runtime does not read.")
MANIFEST_FIELD_MISSING: Final = _code("manifest_field_missing", "artifact", "The manifest lacks a field it needs.")
MANIFEST_FIELD_INVALID: Final = _code("manifest_field_invalid", "artifact",
                                      "A manifest field has the wrong type or value.")
PROBE_MISSING: Final = _code("probe_missing", "artifact",
                             "The artifact has no probe set to verify with (re-convert it with this edge-runtime).")
PROBE_INVALID: Final = _code("probe_invalid", "artifact", "The artifact's probe set does not decode, holds no sample, "
                             "holds a sample its task refuses, inflates past its recorded size, does not match "
                             "its manifest, or compares nothing its budget can judge (tune).")
MANIFEST_SHAPE_DYNAMIC: Final = _code("manifest_shape_dynamic", "artifact",
                                      "A tensor shape in the manifest is not static.")
MANIFEST_TASK_UNKNOWN: Final = _code("manifest_task_unknown", "artifact",
                                     "The manifest names a task that is not registered.")

# -- device: the operator's (DeviceError, exit 4) ---------------------------------------------------
DEVICE_UNAVAILABLE: Final = _code("device_unavailable", "device",
                                  "No device here can run the artifact, or the backend's package is missing.")
DEVICE_UNKNOWN: Final = _code("device_unknown", "device", "No device backend has that name.")
DEVICE_NO_VARIANT: Final = _code("device_no_variant", "device", "The artifact has no variant for the target asked for.")
DEVICE_BACKEND_BROKEN: Final = _code("device_backend_broken", "device", "A device backend failed to initialise.")
DEVICE_LOAD_FAILED: Final = _code("device_load_failed", "device", "The backend could not load the model.")
DEVICE_WARMUP_FAILED: Final = _code("device_warmup_failed", "device", "The model loaded but failed its warm-up run.")
DEVICE_FELL_BACK: Final = _code("device_fell_back", "device",
                                "Under strict, the device asked for is not the one that would run.")
DEVICE_DELEGATE_MISSING: Final = _code("device_delegate_missing", "device",
                                       "The Edge TPU delegate (libedgetpu) cannot be loaded.")
DEVICE_MODEL_NEEDS_EDGETPU: Final = _code("device_model_needs_edgetpu", "device",
                                          "The model is compiled for the Edge TPU and cannot run on a CPU.")
DEVICE_WORKER_DIED: Final = _code("device_worker_died", "device", "The isolated worker process died while loading.")
DEVICE_WORKER_TIMEOUT: Final = _code("device_worker_timeout", "device",
                                     "The isolated worker did not finish loading in time.")

# -- timeout: ours (InferenceTimeout, exit 5) -------------------------------------------------------
INFERENCE_TIMEOUT: Final = _code("inference_timeout", "timeout", "The call did not finish within its deadline.")

# -- runtime: ours (InferenceRuntimeError, exit 6) --------------------------------------------------
INFERENCE_FAILED: Final = _code("inference_failed", "runtime", "The backend failed while running a valid input.")
BACKEND_CRASHED: Final = _code("backend_crashed", "runtime",
                               "The process running the backend crashed during the call; a new one is starting.")
RUNTIME_CLOSED: Final = _code("runtime_closed", "runtime", "The runtime was closed before or during the call.")
RESULT_NONFINITE: Final = _code("result_nonfinite", "runtime", "The model produced NaN or infinity.")
NON_FINITE_OUTPUT: Final = _code("non_finite_output", "runtime",
                                 "The device returned NaN or infinity in a float output: a device fault, never a result.")

# -- parity: a convert's (ParityError, exit 7) ------------------------------------------------------
PARITY_BELOW_BUDGET: Final = _code("parity_below_budget", "parity",
                                   "The int8 model's agreement with fp32 is under --min-parity; nothing was written.")
PARITY_BELOW_BUDGET_HERE: Final = _code("parity_below_budget_here", "parity",
                                        "On this machine's device the artifact's probe set measures parity under "
                                        "its budget (edge-infer verify, load(verify=True)).")

# -- other (EdgeRuntimeError itself, exit 1) --------------------------------------------------------
EDGE_RUNTIME_ERROR: Final = _code("edge_runtime_error", "other", "An error with no more specific code.")
TASK_INVALID: Final = _code("task_invalid", "other",
                            "A registered task cannot be imported or is not a Task (a broken plug-in).")
CONVERTER_INVALID: Final = _code("converter_invalid", "other",
                                 "A registered converter cannot be loaded or misbehaves (a broken plug-in).")
DEPENDENCY_MISSING: Final = _code("dependency_missing", "other", "A package this command needs is not installed.")
EVAL_BELOW_MIN_ACCURACY: Final = _code("eval_below_min_accuracy", "other",
                                       "The accuracy measured is under --min-accuracy.")
# score's verdict takes the class of the most frequent per-input error
_VERDICT_LAYERS: Final = ("input", "artifact", "device", "timeout", "runtime")
SCORE_NOTHING_SUCCEEDED: Final = _code("score_nothing_succeeded", "other",
                                       "No input of the score run succeeded.", also=_VERDICT_LAYERS)
SCORE_ERROR_RATE_EXCEEDED: Final = _code("score_error_rate_exceeded", "other",
                                         "More inputs failed than --max-error-rate allows.", also=_VERDICT_LAYERS)
UNEXPECTED: Final = _code("unexpected", "other", "An exception outside the error tree (a bug: run with --debug).")
UNKNOWN: Final = _code("unknown", "other", "An error recorded without a code.")

# -- serve: refusals of `edge-infer serve` (a ServeError's code; the runtime's own codes pass through) ---
SERVE_REQUEST_MALFORMED: Final = _code("serve_request_malformed", "input",
                                       "The inference request does not follow the Open Inference Protocol (JSON, "
                                       "datatypes, shapes, binary sizes); the message says where.")
SERVE_REQUEST_TOO_LARGE: Final = _code("serve_request_too_large", "input",
                                       "The request body is over the server's byte cap (refused before reading it).")
SERVE_REQUEST_TIMEOUT: Final = _code("serve_request_timeout", "input",
                                     "The request body did not arrive within the server's read timeout.")
SERVE_MODEL_NOT_FOUND: Final = _code("serve_model_not_found", "input", "The server has no model of that name or version.")
SERVE_UNAUTHORIZED: Final = _code("serve_unauthorized", "input", "The bearer token is missing or wrong.")
SERVE_OVERLOADED: Final = _code("serve_overloaded", "other",
                                "The model's in-flight and queue bounds are full: retry later (HTTP 429).")
SERVE_NOT_READY: Final = _code("serve_not_ready", "other",
                               "The server is still loading its models or is draining to shut down (HTTP 503).")

# -- score --engine ray: a node's copy of the artifact (the runtime's own artifact codes pass through) ---
ARTIFACT_COPY_DIFFERS: Final = _code("artifact_copy_differs", "artifact",
                                     "A Ray node's copy of the artifact is sealed differently from the job's "
                                     "(another version): its rows fail, never scored with it.")

# -- shadow: two inference versions on the same inputs ---------------------------------------------
SHADOW_TASK_MISMATCH: Final = _code("shadow_task_mismatch", "input",
                                    "edge-infer shadow was given artifacts of two different tasks: their outputs "
                                    "cannot be compared.")
SHADOW_AGREEMENT_BELOW: Final = _code("shadow_agreement_below", "parity",
                                      "edge-infer shadow measured the two sides agreeing on fewer inputs than "
                                      "--min-agreement.")

# -- import: an I/O tensor quantized per channel (the runtime applies one scale per I/O tensor) -----
IMPORT_IO_PER_CHANNEL: Final = _code("import_io_per_channel", "artifact",
                                     "An input or output tensor of the TFLite model to import is quantized per "
                                     "channel (several scales): re-export it with per-tensor I/O quantization.")

# -- import: a detector head that is another family's than --family (a YOLOX head read as yolo) -----
IMPORT_FAMILY_MISMATCH: Final = _code("import_family_mismatch", "input",
                                      "The detector's graph shows another family's head than --family states (a "
                                      "YOLOX objectness column read as yolo, say), or scores its activation "
                                      "contradicts (logits read as scores): the message names the fix.")

# -- convert: --parity-data that is the calibration data (parity on calibrated samples is not held-out) --
CONVERT_PARITY_IS_CALIBRATION: Final = _code("convert_parity_is_calibration", "input",
                                             "Every --parity-data sample is also a calibration sample: parity "
                                             "measured on the data the quantizer calibrated on is not held-out "
                                             "parity; give held-out samples (shared ones are left out, said).")

# -- eval: every sample of the evaluation failed (an accuracy of 0 would measure no prediction) --
EVAL_NOTHING_SUCCEEDED: Final = _code("eval_nothing_succeeded", "other",
                                      "Every evaluated sample failed with an error: the accuracy measures no "
                                      "prediction (the error's class gives the exit code).", also=_VERDICT_LAYERS)


# -- serve: a per-tensor parameter of an extension the server does not implement (shared memory) ------
SERVE_EXTENSION_UNSUPPORTED: Final = _code("serve_extension_unsupported", "input",
                                           "The request asks for a protocol extension or tensor parameter this "
                                           "server does not implement (shared-memory regions, an unknown output "
                                           "parameter): refused, never answered as if honoured.")

# -- convert: the ONNX source's detector head is another family's than --family states ------------------
CONVERT_FAMILY_MISMATCH: Final = _code("convert_family_mismatch", "input",
                                       "The ONNX source's detector head is another family's than --family states "
                                       "(a YOLOX objectness column read as yolo, say), or its scores contradict the "
                                       "stated activation: parity cannot catch it (the fp32 reference decodes the "
                                       "same wrong way); the message names the fix.")
# -- load: a bucket's first outputs are not what the manifest says the model returns ---------------------
OUTPUT_CONTRACT_MISMATCH: Final = _code("output_contract_mismatch", "artifact",
                                        "A bucket's first outputs on this device are not the manifest's (an "
                                        "output missing, another element count, integer codes of another type "
                                        "or where the manifest says float): every answer would be read wrongly.")
# -- load: a bucket's model takes other inputs than the tensors the task feeds ---------------------------
INPUT_CONTRACT_MISMATCH: Final = _code("input_contract_mismatch", "artifact",
                                       "A bucket's model takes other inputs than the manifest's tensors (a Core ML "
                                       "image-typed input where the task feeds a normalised tensor, another name "
                                       "or shape): refused at load, never run on a reinterpreted input.")
# -- tune: a measured decision that could not be kept (later loads would silently keep the static policy) --
TUNE_NOT_CACHED: Final = _code("tune_not_cached", "device",
                               "tune measured a decision but could not cache it (a read-only or full cache "
                               "dir): later loads with device auto keep the static policy; make the cache dir "
                               "writable, or pass --no-save.")
# -- import: a stated normalisation that leaves the input almost no quantization steps ---------------------
IMPORT_NORMALISATION_COLLAPSES: Final = _code("import_normalisation_collapses", "input",
                                              "The normalisation maps every pixel value into under 1/16 of the "
                                              "quantized input's steps: nearly every image would reach the model "
                                              "as the same input; state the normalisation it was trained with.")
