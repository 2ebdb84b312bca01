"""The entry-point scan the three registries share (``edge_runtime.plugins``): it reads the
``.dist-info``/``.egg-info`` folders on ``sys.path`` itself, without importing
``importlib.metadata`` (~50 ms of every process's start), and must read what
``importlib.metadata.entry_points()`` reads."""

import subprocess
import sys
import zipfile
from importlib import metadata

from conftest import add_distribution, shared

from edge_runtime import plugins


def _fresh(monkeypatch, *extra):
    for p in extra:
        monkeypatch.syspath_prepend(str(p))
    plugins.forget_scan()


def test_the_scan_reads_what_importlib_metadata_reads():
    plugins.forget_scan()
    ours = {(e.group, e.name, e.value) for eps in plugins._all_entry_points().values() for e in eps}
    eps = metadata.entry_points()
    ref = {(e.group, e.name, e.value) for g in eps.groups for e in eps.select(group=g)}
    assert ours == ref
    assert {"onnxruntime", "openvino", "tflite"} <= set(plugins.entry_point_refs("edge_runtime.devices"))


def test_parse_entry_points_skips_comments_blank_and_malformed_lines():
    text = ("# a comment\n[edge_runtime.devices]\n; another\n\n  spaced  =  pkg.mod:Cls [extra]  \nnot a pair\n"
            " = no_name:X\n[other]\nx=y:z\n")
    got = plugins.parse_entry_points(text, "some-dist")
    assert got == [plugins.EntryPoint("edge_runtime.devices", "spaced", "pkg.mod:Cls [extra]", "some-dist"),
                   plugins.EntryPoint("other", "x", "y:z", "some-dist")]


def test_a_plugin_overrides_a_builtin_and_the_first_dist_of_a_name_wins(tmp_path, monkeypatch):
    first, second = tmp_path / "a", tmp_path / "b"
    add_distribution(first, "edge-runtime-extra", {"edge_runtime.devices": {"openvino": "mine:Backend"}})
    add_distribution(second, "edge-runtime-extra", {"edge_runtime.devices": {"openvino": "shadowed:Backend"}})
    monkeypatch.syspath_prepend(str(second))
    _fresh(monkeypatch, first)          # first is now before second on sys.path
    try:
        assert plugins.entry_point_refs("edge_runtime.devices")["openvino"] == "mine:Backend"
    finally:
        plugins.forget_scan()


def test_broken_metadata_reads_as_no_entries(tmp_path, monkeypatch):
    add_distribution(tmp_path, "edge-runtime-good", {"edge_runtime.tasks": {"good": "good:Task"}})
    bad = tmp_path / "edge_runtime_bad-0.dist-info"
    bad.mkdir()
    (bad / "entry_points.txt").write_bytes(b"[edge_runtime.tasks]\nbad = \xff\xfe:X\n")    # not UTF-8
    (tmp_path / "edge_runtime_empty-0.dist-info").mkdir()                                 # no entry_points.txt
    _fresh(monkeypatch, tmp_path, tmp_path / "missing-folder")
    try:
        refs = plugins.entry_point_refs("edge_runtime.tasks")
        assert refs["good"] == "good:Task" and "bad" not in refs
        assert "image-classification" in refs              # the built-ins are untouched
    finally:
        plugins.forget_scan()


def test_a_distribution_inside_a_zip_on_sys_path_is_read(tmp_path, monkeypatch):
    src = tmp_path / "src"
    add_distribution(src, "edge-runtime-zipped", {"edge_runtime.tasks": {"zipped": "zipped:Task"}})
    archive = tmp_path / "plugins.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for f in (src / "edge_runtime_zipped-0.dist-info").iterdir():
            z.write(f, f"edge_runtime_zipped-0.dist-info/{f.name}")
    _fresh(monkeypatch, archive)
    try:
        assert plugins.entry_point_refs("edge_runtime.tasks")["zipped"] == "zipped:Task"
    finally:
        plugins.forget_scan()


def test_loading_and_running_a_model_does_not_import_importlib_metadata(tmp_path):
    from edge_runtime.converters.tflite_import import import_tflite

    coral = shared("coral")
    art = tmp_path / "mnv1"
    import_tflite(coral / "mobilenet_v1_0.25_128_quant.tflite", art, labels=coral / "imagenet_labels.txt")
    code = ("import sys, edge_runtime as er; rt = er.load(sys.argv[1], device='tflite'); r = rt.infer(sys.argv[2]); "
            "print(r.prediction, 'importlib.metadata' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(art), str(coral / "cat.bmp")], capture_output=True,
                         text=True, check=True)
    assert out.stdout.split()[-1] == "False", out.stdout


# what a raw LiteRT script (numpy, PIL, ai_edge_litert) never imports, and `edge-infer infer --image x.bmp`
# no longer does either: each was milliseconds of every process start (2-core AMD EPYC with AVX-512 VNNI)
NOT_ON_THE_INFER_PATH = ("importlib.metadata", "dataclasses", "tempfile", "concurrent.futures", "PIL.PngImagePlugin",
                         "PIL.JpegImagePlugin", "PIL.GifImagePlugin", "PIL.PpmImagePlugin", "subprocess")


def test_the_cli_infer_path_imports_none_of_the_costly_modules_a_raw_script_skips(tmp_path):
    from edge_runtime.converters.tflite_import import import_tflite

    coral = shared("coral")
    art = tmp_path / "mnv1"
    import_tflite(coral / "mobilenet_v1_0.25_128_quant.tflite", art, labels=coral / "imagenet_labels.txt")
    code = ("import sys\nfrom edge_runtime.cli import main\n"
            "try:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            "print('MODULES', ' '.join(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code, "infer", str(art), "--image", str(coral / "cat.bmp"), "--device",
                          "tflite", "--json"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert '"prediction"' in out.stdout
    imported = set(out.stdout.rsplit("MODULES", 1)[1].split())
    assert "PIL.BmpImagePlugin" in imported and "edge_runtime.runtime" in imported    # the list is read right
    assert not imported & set(NOT_ON_THE_INFER_PATH), sorted(imported & set(NOT_ON_THE_INFER_PATH))
