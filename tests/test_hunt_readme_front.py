"""README from the top to "Hardware detection" against the program (h30): each case here was a place
where the README said one thing and the program did another."""

import copy
import re
from types import SimpleNamespace

import click
import pytest
from click.testing import CliRunner

from conftest import ROOT

from edge_runtime.cli import main


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


# -- $EDGE_RUNTIME_THREADS under a CPU quota --------------------------------------------------------
# README: `device_options={"threads": N}` or `$EDGE_RUNTIME_THREADS` decide; a quota gives the usable
# count only where nothing set one. Before, a quota replaced EDGE_RUNTIME_THREADS=2 by 1, silently.

def _quota_hw():
    from edge_runtime import hardware

    hw = copy.deepcopy(hardware.detect())
    hw["cpu"].update(cores=2, usable=1, usable_limited_by="an affinity mask of 1 CPU")
    return hw


def test_quota_keeps_the_operators_thread_count(monkeypatch):
    from edge_runtime.devices.options import threads_option
    from edge_runtime.runtime_options import quota_threads

    backend = SimpleNamespace(options=[threads_option()])
    choice = SimpleNamespace(suitability=SimpleNamespace(tier="cpu"))
    hw = {"cpu": {"cores": 2, "usable": 1, "usable_limited_by": "a cgroup quota of 1 CPU"}}
    monkeypatch.delenv("EDGE_RUNTIME_THREADS", raising=False)
    assert quota_threads(hw, backend, {}, choice)["threads"] == 1          # nothing set one: the quota's
    monkeypatch.setenv("EDGE_RUNTIME_THREADS", "2")
    assert quota_threads(hw, backend, {}, choice) is None                  # the operator's count stands


def test_quota_keeps_edge_runtime_threads_end_to_end(digits_artifact, monkeypatch):
    import edge_runtime as er

    monkeypatch.setenv("EDGE_RUNTIME_THREADS", "2")
    with er.load(digits_artifact, device="onnxruntime", hardware=_quota_hw()) as rt:
        info = rt.info()
        assert info["threads_from_quota"] is None
        assert "threads" not in info["device_options"]
        assert [s.get("threads") for s in info["sessions"]] == [2]
        assert rt.infer(ROOT / "models/zoo/digits-cnn/held_out/3/0013.png").prediction == "3"


# -- infer: --deadline-ms beside --limit deadline_ms ------------------------------------------------
# README: `--limit` lowers a limit; a key given twice with different values is refused. Before,
# `--limit deadline_ms=50 --deadline-ms 3000` ran under 3000 ms, exit 0: the lowered limit dropped.

def test_deadline_ms_and_limit_deadline_that_disagree_are_refused(text_art):
    res = run("infer", text_art, "--text", "good", "--device-option", "stall_ms=200",
              "--limit", "deadline_ms=50", "--deadline-ms", "3000")
    assert res.exit_code == 2, res.output
    assert res.stderr.startswith("error [input_invalid]") and "--deadline-ms 3000" in res.stderr, res.stderr
    assert "prediction" not in res.stdout
    res = run("infer", text_art, "--text", "good", "--limit", "deadline_ms=3000", "--deadline-ms", "3000", "--json")
    assert res.exit_code == 0, res.output
    res = run("infer", text_art, "--text", "good", "--device-option", "stall_ms=200", "--limit", "deadline_ms=50")
    assert res.exit_code == 5 and "inference_timeout" in res.stderr, res.output      # the lowered limit holds


# -- every subcommand's --help has examples ---------------------------------------------------------

def test_every_subcommand_help_has_examples():
    """`tune --help` had none."""
    without = []
    for cmd in sorted(main.list_commands(click.Context(main))):
        res = run(cmd, "--help")
        assert res.exit_code == 0, res.output
        lines = res.stdout.splitlines()
        if not (any(x.strip() == "Examples:" for x in lines)
                and any(x.strip().startswith(f"edge-infer {cmd}") for x in lines)):
            without.append(cmd)
    assert not without, f"--help without examples: {without}"


# -- the CLI synopsis names every option ------------------------------------------------------------
# serve and shadow end in "...": their sections ("Serving", "Inference versions") list the rest.

def _synopsis() -> dict[str, str]:
    text = (ROOT / "README.md").read_text()
    sec = text[text.index("\n## CLI\n"):text.index("### The `openvino` target")]
    start = sec.index("```\n") + 4
    block = sec[start:sec.index("```", start)]
    out: dict[str, str] = {}
    cur = None
    for line in block.splitlines():
        m = re.match(r"edge-infer (\w+)", line)
        if m:
            cur = m.group(1)
            out[cur] = ""
        if cur:
            out[cur] += line.split("  # ")[0] + " "
    return out


def test_readme_synopsis_names_every_option():
    """bench, convert, diff, import, infer and score took options the block did not name (`--draw`,
    `--no-timings`, `--batch-size`, ...)."""
    syn = _synopsis()
    problems = []
    for cmd in sorted(set(main.list_commands(click.Context(main))) - {"serve", "shadow"}):
        assert cmd in syn, f"README's CLI block has no edge-infer {cmd}"
        command = main.get_command(click.Context(main), cmd)
        documented = set(re.findall(r"(?<![\w-])--?[a-z0-9][a-z0-9-]*", syn[cmd]))
        options = [p for p in command.params if isinstance(p, click.Option) and "--help" not in p.opts]
        taken = {x for p in options for x in p.opts + p.secondary_opts}
        wrong = sorted(o for o in documented if o.startswith("--") and o not in taken)
        if wrong:
            problems.append(f"README names {wrong} for edge-infer {cmd}, which it does not take")
        missing = [p.opts[-1] for p in options if not documented & set(p.opts + p.secondary_opts)]
        if missing:
            problems.append(f"edge-infer {cmd} takes {missing}, which README's CLI block does not name")
    assert not problems, "\n".join(problems)


# -- --device-option KEY given twice --------------------------------------------------------------------
# README: an option given twice with different values is exit 2, not the last one kept. Before,
# `--device-option threads=1 --device-option threads=2` ran on 2 threads, exit 0.

def test_device_option_key_twice_with_different_values_is_refused(text_art):
    res = run("infer", text_art, "--text", "good", "--device-option", "stall_ms=0",
              "--device-option", "stall_ms=500", "--deadline-ms", "100")
    assert res.exit_code == 2, res.output
    assert res.stderr.startswith("error [input_invalid]") and "stall_ms" in res.stderr, res.stderr
    res = run("infer", text_art, "--text", "good", "--device-option", "stall_ms=0", "--device-option", "stall_ms=0")
    assert res.exit_code == 0, res.output


def test_device_options_parser_keeps_distinct_keys():
    from edge_runtime.cli_common import device_options
    from edge_runtime.errors import InputError

    assert device_options(["threads=2", "cache=false", "cache_dir=/tmp/x"]) == {
        "threads": 2, "cache": False, "cache_dir": "/tmp/x"}
    with pytest.raises(InputError) as e:
        device_options(["threads=1", " threads =2"])
    assert e.value.code == "input_invalid"
