"""Run mypy on the shipped packages and hold each file to its committed error count.

`scripts/mypy_baseline.txt` lists, per file, how many mypy errors it still has. A file may
only improve: more errors than its baseline (or any error in a file the baseline does not
list) fails. Run with `--update` after fixing errors to shrink the baseline.

    python scripts/check_types.py            # CI
    python scripts/check_types.py --update   # rewrite the baseline after a clean-up
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASELINE = ROOT / "scripts" / "mypy_baseline.txt"
# proto/ is generated code (flatc, protoc), checked by its drift test instead.
PACKAGES = ("lite", "converter", "cloud", "federated", "android_demo")
_ERROR = re.compile(r"^(?P<path>[^:]+\.pyi?):\d+(?::\d+)?: error:")


def run_mypy() -> tuple[Counter[str], str]:
    """Error count per repository-relative file, and mypy's full output.

    The repository root is the `sporenet` package, so mypy is pointed at a folder holding a
    `sporenet` link to the root; module names then match the installed package's.
    """
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "sporenet").symlink_to(ROOT, target_is_directory=True)
        args = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml")]
        for package in PACKAGES:
            args += ["-p", f"sporenet.{package}"]
        done = subprocess.run(
            args, cwd=tmp, env=_env(tmp), capture_output=True, text=True, check=False
        )
    if done.returncode not in (0, 1):  # 2: mypy itself failed (bad config, crash)
        raise SystemExit(f"mypy failed to run (exit {done.returncode}):\n{done.stderr}")
    counts: Counter[str] = Counter()
    prefix = "sporenet/"
    for line in done.stdout.splitlines():
        match = _ERROR.match(line)
        if match:
            path = match["path"]
            counts[path[len(prefix) :] if path.startswith(prefix) else path] += 1
    return counts, done.stdout


def _env(tmp: str) -> dict[str, str]:
    env = dict(os.environ)
    env["MYPYPATH"] = tmp
    return env


def read_baseline() -> Counter[str]:
    """The committed per-file error counts ("count path" lines; # comments allowed)."""
    counts: Counter[str] = Counter()
    if not BASELINE.exists():
        return counts
    for line in BASELINE.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            number, path = line.split(maxsplit=1)
            counts[path] = int(number)
    return counts


def write_baseline(counts: Counter[str]) -> None:
    lines = [
        "# mypy errors still allowed per file (scripts/check_types.py); may only shrink.",
        f"# total {sum(counts.values())}",
    ]
    lines += [f"{counts[path]} {path}" for path in sorted(counts)]
    BASELINE.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--update", action="store_true", help="rewrite the baseline")
    args = parser.parse_args(argv)
    counts, output = run_mypy()
    if args.update:
        write_baseline(counts)
        print(f"baseline: {sum(counts.values())} errors in {len(counts)} files")
        return 0
    baseline = read_baseline()
    worse = {path: n for path, n in counts.items() if n > baseline.get(path, 0)}
    total, allowed = sum(counts.values()), sum(baseline.values())
    if worse:
        print(output)
        for path, n in sorted(worse.items()):
            print(f"{path}: {n} mypy errors, the baseline allows {baseline.get(path, 0)}")
        return 1
    better = sum(1 for path, n in baseline.items() if counts.get(path, 0) < n)
    print(f"mypy: {total} errors, baseline {allowed}; {better} files improved", end="")
    print(" (shrink it with scripts/check_types.py --update)" if better else "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
