"""Shared by the ``edge-infer`` commands: typed errors → one line and an exit code.

Error output (every subcommand, through ``_guard``):

- stderr always gets exactly one line, ``error [code]: message`` (a message that
  spans lines, as some native libraries write them, is joined into one), and
  the process exits with the error's exit code (``InputError`` 2, ``ArtifactError``
  3, ``DeviceError`` 4, ``InferenceTimeout`` 5, ``InferenceRuntimeError`` 6,
  ``ParityError`` 7, anything else 1). No traceback unless ``--debug``
  (accepted before or after the subcommand), which re-raises instead.
- when the command was given ``--json``, stdout also gets the error as one JSON
  document on one line (so it is also a valid line of a JSONL stream), and a
  script reading stdout never has to parse the stderr line::

      {"error": {"type": "InputError", "code": "input_too_long",
                 "message": "text has 12000 characters, over the limit of 10000",
                 "details": {"limit": 10000}}}

  ``type`` is the exception class (``EdgeRuntimeError`` subclasses, or the
  Python class of an unexpected error, whose code is ``unexpected``);
  ``details`` is always present (``{}`` when there are none). The exit code is
  the same as without ``--json``; stderr keeps its one line.
- click's own usage errors (an unknown option, a missing argument) are found
  before any command runs: they stay click's usage text on stderr, exit 2.
"""

from __future__ import annotations

import json
import re
import sys

import click

from . import error_codes as ec
from .errors import EdgeRuntimeError, InputError

_NEWLINES = re.compile(r"\s*[\r\n]+\s*")


def one_line(text: object) -> str:
    return _NEWLINES.sub(" ", str(text)).strip()


def error_dict(exc: Exception) -> dict:
    """``{type, code, message, details}`` of any exception (what ``--json`` prints under ``"error"``)."""
    if isinstance(exc, EdgeRuntimeError):
        d = exc.to_dict()
        return {"type": d["type"], "code": d["code"], "message": d["message"], "details": d.get("details", {})}
    return {"type": type(exc).__name__, "code": ec.UNEXPECTED, "message": str(exc), "details": {}}


def _wants_json(ctx) -> bool:
    c = ctx
    while c is not None:
        if c.params.get("as_json"):
            return True
        c = c.parent
    return False


def _fail(ctx, exc: Exception, stdout_ok: bool = True):
    debug = ctx.find_root().params.get("debug")
    if debug:
        raise exc
    if _wants_json(ctx) and stdout_ok:
        try:
            click.echo(json.dumps({"error": error_dict(exc)}, default=str))     # one line: safe in a JSONL stream
            sys.stdout.flush()
        except OSError:         # stdout itself cannot be written: stderr's line still says what failed
            stdout_ok = False
    if not stdout_ok:
        _drop_stdout()      # what is left in its buffer would fail again at exit, with a traceback
    if isinstance(exc, EdgeRuntimeError):
        click.echo(f"error [{exc.code}]: {one_line(exc.message)}", err=True)
        sys.exit(exc.exit_code)
    click.echo(f"error: {type(exc).__name__}: {one_line(exc)}", err=True)
    sys.exit(1)


def _guard(fn):
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        ctx = click.get_current_context()
        try:
            out = fn(*args, **kwargs)
        except BrokenPipeError:
            _reader_gone()
        except (click.exceptions.Exit, click.ClickException, SystemExit):
            raise
        except Exception as exc:
            if isinstance(exc, OSError) and _from_stdout(exc):
                _fail(ctx, _stdout_error(exc), stdout_ok=False)
            _fail(ctx, exc)
        try:
            if sys.stdout is None:      # started with stdout closed (`>&-`): click printed nothing
                raise OSError(9, "stdout is closed")
            sys.stdout.flush()          # a closed pipe shows here, not in the interpreter's last flush
        except BrokenPipeError:
            _reader_gone()
        except OSError as exc:          # a full disk (`> /dev/full`): the output is lost, so not exit 0
            _fail(ctx, _stdout_error(exc), stdout_ok=False)
        return out

    return wrapper


def _from_stdout(exc: OSError) -> bool:
    """Whether ``exc`` was raised by ``click.echo`` writing onto stdout (not by another file)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and tb.tb_frame.f_code.co_name == "echo" and tb.tb_frame.f_locals.get("file") is sys.stdout


def _stdout_error(exc: OSError) -> InputError:
    """The caller's stdout that cannot be written (``> /dev/full``, ``>&-``): an ``InputError`` (exit 2),
    as for an ``-o`` that cannot be written."""
    return InputError(f"cannot write the output <stdout>: {exc.strerror or exc}", code=ec.INPUT_INVALID,
                      path="<stdout>")


def _stdout_lost(exc: OSError):
    """Outside any command's guard (click's own help, version, usage): the typed line on stderr, exit 2."""
    err = _stdout_error(exc)
    click.echo(f"error [{err.code}]: {one_line(err.message)}", err=True)
    sys.exit(err.exit_code)


def _reader_gone():
    """stdout's reader left (``edge-infer infer ... | head -3``): no error line, no traceback at
    exit; the status a shell gives a command killed by SIGPIPE (141), so ``pipefail`` still sees it."""
    _drop_stdout()
    sys.exit(141)


def _drop_stdout() -> None:
    """stdout's fd onto /dev/null: the interpreter's last flush then fails on nothing."""
    import os

    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, AttributeError, ValueError):
        pass


class DebugAnywhereGroup(click.Group):
    """A root group whose ``--debug`` may also come after the subcommand
    (``edge-infer infer ART --image X --debug``): every ``--debug`` token before
    a ``--`` is taken out of the arguments and given to the group. A text that
    is literally ``--debug`` is passed as ``--text=--debug`` or after ``--``."""

    def main(self, *args, **kwargs):
        # click writes --help, --version and usage text before any command's guard runs: a stdout that
        # cannot take it (`--help > /dev/full`) ended in a traceback and exit 1
        try:
            return super().main(*args, **kwargs)
        except SystemExit as done:
            if done.code in (0, None) and sys.stdout is None:    # `--help >&-`: click printed nothing, exit 0
                _stdout_lost(OSError(9, "stdout is closed"))
            raise
        except BrokenPipeError:
            _reader_gone()
        except OSError as exc:
            if not _from_stdout(exc):
                raise
            _drop_stdout()
            _stdout_lost(exc)

    def parse_args(self, ctx, args):
        args = list(args)
        cut = args.index("--") if "--" in args else len(args)
        head = args[:cut]
        if "--debug" in head:
            args = ["--debug"] + [a for a in head if a != "--debug"] + args[cut:]
        return super().parse_args(ctx, args)


class LazyGroup(DebugAnywhereGroup):
    """A group whose subcommands (``name -> "module:attribute"``) are imported when first used:
    ``edge-infer infer`` does not import the converters', server's and cluster's modules (about
    0.1 s of a one-shot call's start). ``--help`` lists, and so imports, them all."""

    def __init__(self, *args, lazy: dict[str, str] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.lazy = dict(lazy or {})

    def list_commands(self, ctx):
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx, name):
        if name not in self.commands and name in self.lazy:
            import importlib

            module, attr = self.lazy[name].split(":")
            cmd = getattr(importlib.import_module(module, __package__), attr)
            if type(cmd) is click.Command:
                cmd.__class__ = SingleValueCommand      # adds no state: only refuses a repeated option
            self.add_command(cmd, name)
        return super().get_command(ctx, name)


class SingleValueCommand(click.Command):
    """A command that refuses an option taking one value given twice with different values (``--text good
    --text bad``, ``-o a -o b``, ``--letterbox --stretch``): click keeps the last one, silently dropping the
    first. The same value twice (``--json --json``, ``--field f --field f``) loses nothing and is let through."""

    def parse_args(self, ctx, args):
        try:        # click's parser internals (8.1-8.5): should they change, click's own parse still runs
            parser = self.make_parser(ctx)          # fresh option objects: each one's values all kept, in order
            for o in {*parser._long_opt.values(), *parser._short_opt.values()}:
                o.action = {"store": "append", "store_const": "append_const"}.get(o.action, o.action)
            opts, _, order = parser.parse_args(args=list(args))
        except click.UsageError:
            raise
        except Exception:       # not a usage error: the repeat check is skipped, never the command
            return super().parse_args(ctx, args)
        for p in dict.fromkeys(order):
            if not isinstance(p, click.Option) or p.multiple or p.count or order.count(p) < 2:
                continue
            if len({repr(v) for v in opts.get(p.name or "", ())}) > 1:
                raise click.UsageError(f"{' / '.join(p.opts + p.secondary_opts)} given more than once with "
                                       "different values: give it once (click would keep only the last)", ctx=ctx)
        return super().parse_args(ctx, args)


def emit(data, as_json: bool, human) -> None:
    """``data`` as indented JSON under ``--json``, else ``human(data)``."""
    if as_json:
        click.echo(json.dumps(data, indent=2, default=str))
    else:
        human(data)


# -- the device flags, defined once for every command that loads an artifact -----------------
DEVICE_HELP = ("auto, or BACKEND[:DEVICE]: onnxruntime, onnxruntime:cuda[:N], onnxruntime:tensorrt, openvino:gpu, "
               "tflite, edgetpu:usb, coreml:cpu_only, ... (`edge-infer devices` lists them and what auto picks)")
REQUIRE_HELP = "Fail (exit 4) instead of falling back to another device."


def device_options(pairs) -> dict:
    """``--device-option KEY=VALUE`` (repeatable); values parse as JSON when they can. Which
    keys and values are valid is the chosen backend's declaration, checked at load."""
    out: dict = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise InputError(f"--device-option wants KEY=VALUE, got {pair!r}", code=ec.INPUT_INVALID)
        try:
            parsed = json.loads(value)
        except ValueError:
            parsed = value
        if key in out and repr(out[key]) != repr(parsed):   # `threads=1` then `threads=2` ran on 2, silently
            raise InputError(f"--device-option {key} given more than once with different values: give it once",
                             code=ec.INPUT_INVALID, option=key)
        out[key] = parsed
    return out


def device_option_help() -> str:
    """The ``--device-option`` help, generated from every registered backend's declarations."""
    from .devices import registry

    parts = []
    for name in registry.available_backends():
        try:
            opts = registry.get_backend(name).options
        except Exception:  # noqa: BLE001 - a broken third-party backend must not break --help
            continue
        parts.append(f"{name}: " + (", ".join(f"{o.name}={o.metavar}" for o in opts) or "none"))
    return ("Backend option KEY=VALUE, repeatable; an unknown key or a bad value for the chosen backend exits 2 "
            "naming the valid ones (`edge-infer devices --json` shows each one's help). " + "; ".join(parts) + ".")


class _DeviceOptionFlag(click.Option):
    """``--device-option``, whose help is generated when shown (importing each backend module,
    never a framework), not when the CLI starts."""

    def get_help_record(self, ctx):
        self.help = device_option_help()
        return super().get_help_record(ctx)


def device_flags(*, require: bool = True, options: bool = True):
    """``--device``, ``--require-device`` and ``--device-option`` (as ``device``,
    ``require_device`` and ``device_option``), with one help text each."""
    def decorate(fn):
        if options:
            fn = click.option("--device-option", "device_option", multiple=True, metavar="KEY=VALUE",
                              cls=_DeviceOptionFlag)(fn)
        if require:
            fn = click.option("--require-device", is_flag=True, help=REQUIRE_HELP)(fn)
        return click.option("--device", default="auto", show_default=True, help=DEVICE_HELP)(fn)

    return decorate


class Finite(click.FloatRange):
    """click's ``FloatRange`` without NaN or infinity: every comparison with NaN is false, so it passed any
    range (``serve --drain-timeout nan`` crashed at start, ``score --max-error-rate nan`` never failed)."""

    def convert(self, value, param, ctx):
        import math

        rv = super().convert(value, param, ctx)
        if not math.isfinite(rv):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return rv


class Fraction(Finite):
    """A number in [0, 1]: click's ``FloatRange`` lets NaN through (every comparison with it is
    false), so ``--min-agreement nan`` passed any agreement, 0 included, and ``--agree-at nan``
    made every input disagree."""

    name = "fraction"

    def __init__(self) -> None:
        super().__init__(0, 1)

    def convert(self, value, param, ctx):
        import math

        rv = click.FloatRange.convert(self, value, param, ctx)
        if not math.isfinite(rv):
            self.fail(f"{value!r} is not a number in the range 0<=x<=1.", param, ctx)
        return rv


PORT = click.IntRange(0, 65535)     # bind() raised OverflowError (exit 1) on -1 or 70000
