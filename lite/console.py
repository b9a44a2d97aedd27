"""What every sporenet console script shares: `--version`, help that shows defaults, and a
quiet exit when the reader of its output goes away (`sporenet-inspect m.spore | head`).

Lives in lite, the lowest layer, so the converter's and the server's commands can use it.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import sporenet

EXIT_BROKEN_PIPE = 141
"""What a shell reports for a command killed by SIGPIPE (128 + 13), as `yes | head` does."""

F = TypeVar("F", bound=Callable[..., int])


class HelpFormatter(argparse.HelpFormatter):
    """Wraps each paragraph of a description or epilog on its own (lines indented by two
    spaces, such as examples, stay as written) and appends `(default: X)` to an option's
    help when it has a meaningful default (not None, False or an empty list)."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        paragraphs = []
        for paragraph in text.split("\n\n"):
            if paragraph.startswith("  "):
                paragraphs.append("\n".join(indent + line for line in paragraph.splitlines()))
            else:
                paragraphs.append(super()._fill_text(paragraph, width, indent))
        return "\n\n".join(paragraphs)

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            "%(default)" in text
            or default is None
            or default is False
            or default is argparse.SUPPRESS
            or default == []
            or action.option_strings == []
        ):
            return text
        return f"{text} (default: %(default)s)"


def make_parser(
    prog: str, description: str, *, epilog: str | None = None, **kwargs: Any
) -> argparse.ArgumentParser:
    """An ArgumentParser with the shared formatter and a `--version` option."""
    parser = argparse.ArgumentParser(
        prog=prog, description=description, epilog=epilog, formatter_class=HelpFormatter, **kwargs
    )
    add_version(parser)
    return parser


def add_version(parser: argparse.ArgumentParser) -> None:
    """Add `--version`, printing `PROG X.Y.Z` (the sporenet package's version)."""
    parser.add_argument(
        "--version",
        action="version",
        version=f"%(prog)s {sporenet.__version__}",
        help="print the version and exit",
    )


def add_threads(parser: argparse.ArgumentParser, default: int = 1) -> None:
    """Add `--threads N`: the BLAS threads of everything the command runs (0: the BLAS
    library's own choice, one per core, which collapses on a busy machine)."""
    parser.add_argument(
        "--threads",
        type=int,
        default=default,
        help="BLAS threads for training and inference (0: the BLAS library's own choice)",
    )


def apply_threads(parser: argparse.ArgumentParser, threads: int) -> None:
    """Make `threads` the default BLAS thread count of this process and of the processes
    it starts (through $SPORENET_THREADS, which `lite.threads.default_threads` reads)."""
    from sporenet.lite.threads import THREADS_ENV

    if threads < 0:
        parser.error(f"--threads must be >= 0, got {threads}")
    os.environ[THREADS_ENV] = str(threads)


def quiet_on_closed_pipe(main: F) -> F:
    """Wrap a console script's `main` so that writing to a closed pipe ends it quietly with
    exit status 141 instead of a BrokenPipeError traceback."""

    @functools.wraps(main)
    def wrapper(*args: Any, **kwargs: Any) -> int:
        try:
            code = main(*args, **kwargs)
            sys.stdout.flush()
            return code
        except BrokenPipeError:
            # Python flushes stdout again at exit; point it at devnull so that flush
            # cannot raise a second time.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            return EXIT_BROKEN_PIPE

    return wrapper  # type: ignore[return-value]
