"""`looped` command: a thin dispatcher; each subcommand's parser lives beside its logic."""
from __future__ import annotations

import importlib
import sys

COMMANDS = {  # name -> (module, function, one-line help)
    "accounting": ("looped.accounting", "main", "parameter and FLOPs accounting of a configuration"),
    "train": ("looped.train", "main", "train one configuration for a FLOPs budget"),
    "sweep": ("looped.studies.sweep", "main", "run (or size, with --dry-run) a named study, resumably"),
    "runs": ("looped.cli", "runs_main", "print a study's runs table and export the fitter's CSV"),
    "fit": ("looped.fit_cli", "main", "fit the joint scaling law (phi) to a runs table"),
    "data": ("looped.data", "main", "prepare tokenizer and data shards"),
    "bench": ("looped.studies.bench", "main", "benchmarks: `bench train`, `bench fit`, `bench profile`"),
    "robustness": (
        "looped.studies.robustness",
        "main",
        "is phi a constant: other forms, drift with compute, lack of fit",
    ),
    "paired": (
        "looped.studies.paired_study", "main", "case studies: paired estimators of delta-phi and their simulation"
    ),
    "external": (
        "looped.studies.external", "main", "phi on another lab's looped runs (qlabs scaling-exponents tables)"
    ),
}


def usage() -> str:
    lines = ["usage: looped COMMAND [options]    (looped COMMAND --help: its options; looped --version)", "",
             "commands:"]
    lines += [f"  {name:<11} {help_}" for name, (_, _, help_) in COMMANDS.items()]
    return "\n".join(lines)


def version() -> str:
    from . import __version__
    return __version__


def runs_main(argv=None) -> int:
    """`looped runs`: looped.studies.sweep.runs_main, with its --csv destination checked first
    (a missing folder is one line and exit 2, not a pandas traceback)."""
    import argparse

    from .io import destination_error
    first = argparse.ArgumentParser(prog="looped runs", add_help=False)
    first.add_argument("--csv")
    error = destination_error(first.parse_known_args(argv)[0].csv, "--csv")
    if error:
        print(f"looped runs: error: {error}", file=sys.stderr)
        return 2
    from .studies.sweep import runs_main as table
    return table(argv)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    if argv[0] in ("-V", "--version"):
        print(f"looped {version()}")
        return 0
    if argv[0] not in COMMANDS:
        print(f"looped: error: unknown command {argv[0]!r}\n{usage()}", file=sys.stderr)
        return 2
    module, func, _ = COMMANDS[argv[0]]
    return int(getattr(importlib.import_module(module), func)(argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
