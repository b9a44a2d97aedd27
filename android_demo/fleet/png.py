"""A PNG of a fleet run's curves, with no plotting dependency.

Draws accuracy (and participation) per round as polylines on a white canvas with axes and
grid lines, and writes it with a minimal PNG encoder (zlib + CRC-32 from the standard
library). matplotlib is not needed; the curves are identified by colour, and the legend
is written into the PNG's tEXt chunk and the report.
"""

from __future__ import annotations

import itertools
import struct
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

WIDTH, HEIGHT, MARGIN = 640, 400, 40
COLOURS = [(31, 119, 180), (214, 39, 40), (44, 160, 44), (148, 103, 189), (255, 127, 14)]


def encode_png(rgb: np.ndarray, text: dict[str, str] | None = None) -> bytes:
    """8-bit RGB image (H, W, 3) -> PNG bytes (filter 0 on every row)."""
    if rgb.dtype != np.uint8 or rgb.ndim != 3 or rgb.shape[2] != 3:
        raise ValueError(f"expected an (H, W, 3) uint8 image, got {rgb.dtype} {rgb.shape}")
    h, w, _ = rgb.shape

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
        )

    rows = np.concatenate([np.zeros((h, 1), np.uint8), rgb.reshape(h, w * 3)], axis=1)
    out = [b"\x89PNG\r\n\x1a\n", chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))]
    for key, value in (text or {}).items():
        out.append(
            chunk(b"tEXt", key.encode("latin-1") + b"\0" + value.encode("latin-1", "replace"))
        )
    out += [chunk(b"IDAT", zlib.compress(rows.tobytes(), 6)), chunk(b"IEND", b"")]
    return b"".join(out)


def _line(
    img: np.ndarray,
    x0: float,
    y0: float,
    x1: float,
    y1: float,
    colour: tuple[int, int, int],
    width: int = 2,
) -> None:
    steps = int(max(abs(x1 - x0), abs(y1 - y0))) + 1
    xs = np.linspace(x0, x1, steps).round().astype(int)
    ys = np.linspace(y0, y1, steps).round().astype(int)
    for dx in range(-(width // 2), width - width // 2):
        for dy in range(-(width // 2), width - width // 2):
            ok = (
                (xs + dx >= 0)
                & (xs + dx < img.shape[1])
                & (ys + dy >= 0)
                & (ys + dy < img.shape[0])
            )
            img[ys[ok] + dy, xs[ok] + dx] = colour


def plot(path: Path, series: dict[str, Sequence[float]], *, rounds: int, title: str = "") -> None:
    """Curves of values in [0, 1] against rounds 1..rounds, written as a PNG to `path`."""
    img = np.full((HEIGHT, WIDTH, 3), 255, np.uint8)
    left, right, top, bottom = MARGIN, WIDTH - MARGIN // 2, MARGIN // 2, HEIGHT - MARGIN

    def xy(r: float, v: float) -> tuple[float, float]:
        span = max(rounds - 1, 1)
        return left + (r - 1) / span * (right - left), bottom - v * (bottom - top)

    for k in range(11):  # grid at every 0.1
        y = bottom - k / 10 * (bottom - top)
        img[int(y), left:right] = (225, 225, 225) if k % 5 else (170, 170, 170)
    for r in range(1, rounds + 1):
        x = int(xy(r, 0)[0])
        img[bottom : bottom + 5, x] = (0, 0, 0)
    img[top : bottom + 1, left] = (0, 0, 0)
    img[bottom, left : right + 1] = (0, 0, 0)
    legend = []
    for k, (name, values) in enumerate(series.items()):
        colour = COLOURS[k % len(COLOURS)]
        legend.append(f"{name}: rgb{colour}")
        points = [
            xy(r + 1, float(np.clip(v, 0, 1))) for r, v in enumerate(values) if np.isfinite(v)
        ]
        for (xa, ya), (xb, yb) in itertools.pairwise(points):
            _line(img, xa, ya, xb, yb, colour)
        for px, py in points:
            _line(img, px - 2, py, px + 2, py, colour, width=4)
    Path(path).write_bytes(
        encode_png(
            img,
            {
                "Title": title,
                "Legend": "; ".join(legend),
                "Axes": "x: round 1..N, y: 0..1 (grid 0.1)",
            },
        )
    )
