"""Shared by the ``edge-infer`` commands: typed errors → one line and an exit code."""

from __future__ import annotations

import sys

import click

from .errors import EdgeRuntimeError


def _fail(ctx, exc: Exception):
    debug = ctx.find_root().params.get("debug")
    if debug:
        raise exc
    if isinstance(exc, EdgeRuntimeError):
        click.echo(f"error [{exc.code}]: {exc.message}", err=True)
        sys.exit(exc.exit_code)
    click.echo(f"error: {type(exc).__name__}: {exc}", err=True)
    sys.exit(1)


def _guard(fn):
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        ctx = click.get_current_context()
        try:
            return fn(*args, **kwargs)
        except (click.exceptions.Exit, click.ClickException, SystemExit):
            raise
        except Exception as exc:
            _fail(ctx, exc)

    return wrapper
