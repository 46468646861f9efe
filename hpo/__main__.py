"""`hpo COMMAND [FLAGS]` (or `python -m hpo COMMAND`): every command line of the project, one name.

`hpo study --n-trials 4` runs exactly what `python -m hpo.study --n-trials 4` runs: the
command's module is executed as `__main__` (`runpy`), so its exit codes, its error lines and
its own start-up (`trainers.train`'s launcher, for one) are those of `python -m`. The table
below is also what the documentation's command reference is generated from.
"""

from __future__ import annotations

import runpy
import sys

# command -> (module run as __main__, one line for `hpo --help`), in the order a user meets them.
COMMANDS: dict[str, tuple[str, str]] = {
    "init": ("hpo.init", "guided set-up: asks, then writes a commented study.yaml"),
    "study": ("hpo.study", "search LoRA configurations whose full run fits the window"),
    "export": ("hpo.export", "a study's best trial as a preset (or a `trl sft` config)"),
    "train": ("trainers.train", "the full run of a preset, inside its window"),
    "plan": ("analysis.plan", "a run planned from a config.json, before any download"),
    "calibrate": (
        "analysis.calibrate",
        "the time model refitted from trials, a probe or full runs",
    ),
    "report": ("analysis.report", "a study's plots and report.md"),
    "replay": ("hpo.tracking", "send MLflow records that waited on disk for their server"),
    "tiny": ("trainers.tiny", "build a tiny model to try the tools on"),
}


def usage() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = [f"  {name:<{width}}  {line}" for name, (_, line) in COMMANDS.items()]
    return (
        "usage: hpo COMMAND [FLAGS]   (hpo COMMAND --help: its flags)\n\n"
        "commands (each also runs as python -m MODULE):\n" + "\n".join(lines) + "\n"
    )


def main(argv: list[str] | None = None) -> int:
    """Run the command `argv[0]` with the rest of `argv` as its flags; returns the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(usage(), end="")
        return 0
    if args[0] not in COMMANDS:
        print(f"error: unknown command {args[0]!r}\n\n{usage()}", file=sys.stderr, end="")
        return 2
    module = COMMANDS[args[0]][0]
    sys.argv = [module, *args[1:]]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as done:
        code = done.code
        if code is None or isinstance(code, int):
            return code or 0
        print(code, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
