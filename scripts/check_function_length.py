"""Hold shipped functions to at most 80 lines; the few still longer may only shrink.

A function's length is its lines from `def` (decorators excluded) to its last line, the
docstring included, as a reader sees it. Shipped code is every Python file of the package
but tests/, benchmarks/, scripts/, examples/ and the generated bindings in proto/.
`scripts/function_length_allowed.txt` lists the functions still over the limit with their
current length: such a function may not grow, a new one may not pass the limit, and an
entry whose function shrank is tightened with `--update`.

    python scripts/check_function_length.py            # CI
    python scripts/check_function_length.py --update   # rewrite the list after a split
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ALLOWED = ROOT / "scripts" / "function_length_allowed.txt"
LIMIT = 80
NOT_SHIPPED = ("tests", "benchmarks", "scripts", "examples", ".venv", "build", "dist")
# Written by flatc and protoc (scripts/gen_proto.sh), checked by their drift test instead.
GENERATED = ("_generated.py", "_pb2.py", "_pb2_grpc.py")


def shipped_files(root: Path = ROOT) -> Iterator[Path]:
    """The package's own Python files, in a stable order."""
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[0] in NOT_SHIPPED or any(p.startswith(".") for p in rel.parts):
            continue
        if path.name.endswith(GENERATED):
            continue
        yield path


def function_lengths(source: str) -> Iterator[tuple[str, int]]:
    """(qualified name, lines) of every function and method in `source`."""

    def walk(node: ast.AST, prefix: str) -> Iterator[tuple[str, int]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                yield name, (child.end_lineno or child.lineno) - child.lineno + 1
                yield from walk(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{child.name}.")
            else:
                yield from walk(child, prefix)

    yield from walk(ast.parse(source), "")


def long_functions(root: Path = ROOT, limit: int = LIMIT) -> dict[str, int]:
    """Every shipped function over `limit` lines, keyed "path:qualified.name"."""
    found: dict[str, int] = {}
    for path in shipped_files(root):
        rel = path.relative_to(root).as_posix()
        for name, lines in function_lengths(path.read_text(encoding="utf-8")):
            if lines > limit:
                key = f"{rel}:{name}"
                found[key] = max(lines, found.get(key, 0))  # same name twice: the longer
    return found


def read_allowed(path: Path = ALLOWED) -> dict[str, int]:
    """The committed list ("lines path:name" lines; # comments allowed)."""
    allowed: dict[str, int] = {}
    if not path.exists():
        return allowed
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            number, key = line.split(maxsplit=1)
            allowed[key] = int(number)
    return allowed


def write_allowed(found: dict[str, int], path: Path = ALLOWED) -> None:
    lines = [
        f"# Shipped functions still over {LIMIT} lines (scripts/check_function_length.py);",
        "# each may only shrink, and no other function may pass the limit.",
    ]
    lines += [f"{found[key]} {key}" for key in sorted(found)]
    path.write_text("\n".join(lines) + "\n")


def violations(found: dict[str, int], allowed: dict[str, int]) -> list[str]:
    """What breaks the rule: a function over the limit and over its allowance."""
    return [
        f"{key}: {lines} lines, "
        + (f"the list allows {allowed[key]}" if key in allowed else f"the limit is {LIMIT}")
        for key, lines in sorted(found.items())
        if lines > allowed.get(key, LIMIT)
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--update", action="store_true", help="rewrite the allow-list")
    args = parser.parse_args(argv)
    found = long_functions()
    if args.update:
        write_allowed(found)
        print(f"allow-list: {len(found)} functions over {LIMIT} lines")
        return 0
    allowed = read_allowed()
    bad = violations(found, allowed)
    if bad:
        print("\n".join(bad))
        print(f"split these (no function over {LIMIT} lines in shipped code)")
        return 1
    stale = sorted(key for key in allowed if found.get(key, 0) < allowed[key])
    print(f"function length: {len(found)} over {LIMIT} lines, all allowed", end="")
    print(f"; {len(stale)} shrank (scripts/check_function_length.py --update)" if stale else "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
