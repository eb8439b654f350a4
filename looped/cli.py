"""`looped` command: a thin dispatcher; each subcommand's parser lives beside its logic."""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys

from . import __version__
from .io import destination_error

COMMANDS = {  # name -> (module, function, one-line help)
    "accounting": ("looped.accounting", "main", "parameter and FLOPs accounting of a configuration"),
    "train": ("looped.train", "main", "train one configuration for a FLOPs budget"),
    "sweep": ("looped.studies.sweep.runner", "main", "run (or size, with --dry-run) a named study, resumably"),
    "runs": ("looped.studies.sweep.runner", "runs_main", "print a study's runs table and export the fitter's CSV"),
    "fit": ("looped.fit_cli", "main", "fit the joint scaling law (phi) to a runs table"),
    "data": ("looped.data.dataset", "main", "prepare tokenizer and data shards"),
    "bench": ("looped.studies.bench", "main", "benchmarks: `bench train`, `bench fit`, `bench profile`"),
    "constancy": ("looped.studies.constancy.analysis", "main",
                  "is phi a constant: other forms, drift with compute, lack of fit"),
    "misfit": ("looped.studies.constancy.misfit", "main",
               "where the law misses our runs: the ladder of models, phi's anchor"),
    "case-studies": ("looped.studies.case_studies.analysis", "main",
                     "truncation and hyperconnections: paired estimators of delta-phi and their simulation"),
    "corpora": ("looped.studies.corpora", "main", "phi on two corpora with one design (cpu-main and cpu3-main)"),
    "external": ("looped.studies.external.analysis", "main",
                 "phi on another lab's looped runs (qlabs scaling-exponents tables)"),
    "shape": ("looped.studies.shape", "main",
              "is r^phi the right shape: held-out-r tests of power, linear, bounded, free"),
}
# commands renamed when looped/studies/ was grouped by question: old name -> new
RENAMED = {"robustness": "constancy", "paired": "case-studies"}


# The optional libraries and the extra of pyproject.toml that installs each: `pip install looped` fits,
# reads and sizes runs without them; a command that needs one says which extra in one line (exit 2).
EXTRAS = {"torch": "train", "tokenizers": "train", "tqdm": "train",
          "datasets": "paper", "huggingface_hub": "paper", "pyarrow": "paper", "tiktoken": "paper",
          "matplotlib": "report", "seaborn": "report"}


# Libraries a command needs before it starts, where its own error handling would hide which extra is missing
REQUIRES = {"data": ("tokenizers",)}


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def missing_extra(command: str, error: ModuleNotFoundError) -> str | None:
    """The one-line error for a command that stopped on an optional library that is not installed,
    or None when the missing module is not one an extra provides."""
    name = (error.name or "").split(".")[0]
    if name not in EXTRAS:
        return None
    extra = EXTRAS[name]
    pin = (" (torch==2.13.0, from PyPI the CUDA build; for the CPU build first: pip install torch==2.13.0 "
           "--index-url https://download.pytorch.org/whl/cpu)" if extra == "train" else "")
    return (f"looped {command}: error: this needs {name}, which the base install leaves out: "
            f"pip install 'looped[{extra}]'{pin}")


def usage() -> str:
    lines = ["usage: looped COMMAND [options]    (looped COMMAND --help: its options; looped --version)", "",
             "commands:"]
    lines += [f"  {name:<13} {help_}" for name, (_, _, help_) in COMMANDS.items()]
    return "\n".join(lines)


def version() -> str:
    return __version__


# Output files a command writes only after its work, checked here first: a missing folder is one
# line and exit 2, not a traceback at the end (the commands that check their own are not listed).
OUTPUTS = {"runs": "--csv"}


def output_error(command: str, argv: list[str]) -> str | None:
    """Why the output file named on `command`'s command line cannot be written, or None."""
    if command not in OUTPUTS:
        return None
    first = argparse.ArgumentParser(add_help=False)
    first.add_argument(OUTPUTS[command])
    known, _ = first.parse_known_args(argv)
    return destination_error(getattr(known, OUTPUTS[command].lstrip("-")), OUTPUTS[command])


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    if argv[0] in ("-V", "--version"):
        print(f"looped {version()}")
        return 0
    if argv[0] in RENAMED:
        print(f"looped: error: `looped {argv[0]}` is now `looped {RENAMED[argv[0]]}` (same options)", file=sys.stderr)
        return 2
    if argv[0] not in COMMANDS:
        print(f"looped: error: unknown command {argv[0]!r}\n{usage()}", file=sys.stderr)
        return 2
    error = output_error(argv[0], argv[1:])
    if error:
        print(f"looped {argv[0]}: error: {error}", file=sys.stderr)
        return 2
    module, func, _ = COMMANDS[argv[0]]
    if not {"-h", "--help"} & set(argv[1:]):
        for name in REQUIRES.get(argv[0], ()):
            if not _installed(name):
                print(missing_extra(argv[0], ModuleNotFoundError(name=name)), file=sys.stderr)
                return 2
    try:
        return int(getattr(importlib.import_module(module), func)(argv[1:]) or 0)
    except ModuleNotFoundError as e:
        message = missing_extra(argv[0], e)
        if message is None:
            raise
        print(message, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
