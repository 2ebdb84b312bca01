"""``edge-infer``: convert, infer, eval, inspect, import, check, devices, doctor.

Exit codes: 0 ok, 1 unexpected, 2 input (the caller's), 3 artifact,
4 device, 5 timeout, 6 runtime failure, 7 parity under budget. Errors print
one line without a traceback unless ``--debug`` (before or after the
subcommand); under ``--json`` the error is also printed on stdout as
``{"error": {type, code, message, details}}`` (see ``cli_common``).

Every subcommand lives in its own ``cli_*`` module (``COMMANDS``), imported when it
is used: ``infer`` in ``cli_infer`` (its input readers in ``cli_inputs``),
``inspect`` in ``cli_inspect``.
"""

from __future__ import annotations

import click

from .cli_common import LazyGroup


# every subcommand lives in its own module, imported when it is used
COMMANDS = {"infer": ".cli_infer:infer", "inspect": ".cli_inspect:inspect",
            "convert": ".cli_convert:convert", "import": ".cli_import:import_cmd", "check": ".cli_check:check",
            "devices": ".cli_devices:devices", "doctor": ".cli_devices:doctor", "score": ".cli_score:score_cmd",
            "bench": ".cli_bench:bench_cmd", "eval": ".cli_eval:eval_cmd", "verify": ".cli_verify:verify",
            "tune": ".cli_verify:tune", "diff": ".cli_shadow:diff_cmd", "shadow": ".cli_shadow:shadow_cmd",
            "serve": ".cli_serve:serve"}


@click.group(cls=LazyGroup, lazy=COMMANDS)
@click.option("--debug", is_flag=True, help="Show tracebacks (accepted before or after the subcommand).")
@click.version_option(package_name="edge-runtime")
def main(debug):
    """Int8 edge inference: convert models, verify artifacts, run them."""
    import logging

    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")


if __name__ == "__main__":
    main()
