"""`completion bash|zsh`: print the script that makes the shell complete `clustertrain`
(its verbs, options, run ids and inventory hosts)."""

from __future__ import annotations

import argparse

from .completion import script


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("completion", help="print the shell's completion script",
                       description="Print the script that makes SHELL complete "
                       "`clustertrain`: verbs, options, run ids, inventory hosts. Install "
                       "it with: eval \"$(clustertrain completion bash)\" in ~/.bashrc (zsh: "
                       "the same with zsh, in ~/.zshrc).")
    p.add_argument("shell", choices=("bash", "zsh"))
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    print(script(args.shell))
    return 0
