"""The command line run in this process, as a user would type it: its exit code and what
it printed (argparse's own errors included)."""

from __future__ import annotations

from orchestrator.cli import main


def run_cli(argv: list[str], capsys) -> tuple[int, str]:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own errors
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    return code, captured.out + captured.err
