"""``srl``: the SRL family's CLI (docs/srl-data.md for ``data`` and ``synth``).

Errors are the toolkit's envelope, family ``srl``; exit codes in ``cli/toolkit.py``.
"""

from __future__ import annotations

import typer

from cli import toolkit
from cli.srl_data import data_app, synth, translate

app = typer.Typer(
    help="SRL (Supervised Reinforcement Learning) data engine for an ast-grep refactoring agent.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(data_app, name="data")
app.command("synth")(synth)


def main(argv: list[str] | None = None) -> None:
    codes = toolkit.EXIT_CODES["srl"]
    toolkit.run(
        app,
        argv,
        translate=translate,
        usage=lambda message: toolkit.CliFailure("srl", "usage", message, codes["usage"]).error,
        unexpected=lambda err: (
            toolkit.CliFailure("srl", "error", f"{type(err).__name__}: {err}", codes["error"]).error
        ),
        default_json=False,
    )


if __name__ == "__main__":
    main()
