"""The JSON API the page uses (stable; documented in android_demo/README.md).

    POST /api/predict      {"pixels": [64 numbers 0-16, row-major]}
                           -> {"label": int, "probabilities": [10 floats], "latency_ms": float}
    POST /api/samples      {"pixels": [...], "label": int} -> {"stored": int}
    POST /api/personalize  {"epochs": int} -> {"before": float, "after": float, "samples": int}
    GET  /api/status       -> {"model": {...}, "samples": int, "personalization": {...},
                               "federated": {...}}

Requests are checked here, before anything runs: a malformed one gets 400 and
{"error": message}, never a 500. Routing is a dict of (method, path) -> handler.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from sporenet.android_demo.errors import BadRequestError

if TYPE_CHECKING:
    from sporenet.android_demo.app import App

MAX_BODY = 64 * 1024
MAX_EPOCHS = 200
PIXELS = 64
PIXEL_MAX = 16.0


def parse_body(body: bytes) -> dict[str, Any]:
    """The request's JSON object."""
    try:
        value = json.loads(body.decode("utf-8") if body else "")
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequestError(f"the body must be a JSON object: {exc}") from None
    if not isinstance(value, dict):
        raise BadRequestError(f"the body must be a JSON object, got {type(value).__name__}")
    return value


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def pixels(request: dict[str, Any]) -> np.ndarray:
    """`pixels`: 64 numbers in [0, 16], row-major 8x8."""
    value = request.get("pixels")
    if not isinstance(value, list):
        raise BadRequestError(
            f"`pixels` must be a list of {PIXELS} numbers in [0, 16], got "
            f"{type(value).__name__ if value is not None else 'nothing'}"
        )
    if len(value) != PIXELS:
        raise BadRequestError(
            f"`pixels` must hold {PIXELS} numbers (8x8, row-major), got {len(value)}"
        )
    bad = [k for k, v in enumerate(value) if not _number(v) or not 0 <= v <= PIXEL_MAX]
    if bad:
        raise BadRequestError(
            f"`pixels` values must be numbers in [0, 16]; pixel {bad[0]} is {value[bad[0]]!r}"
        )
    return np.array(value, np.float32)


def label(request: dict[str, Any], classes: int) -> int:
    value = request.get("label")
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < classes:
        raise BadRequestError(f"`label` must be an integer in [0, {classes - 1}], got {value!r}")
    return value


def epochs(request: dict[str, Any]) -> int:
    value = request.get("epochs")
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_EPOCHS:
        raise BadRequestError(f"`epochs` must be an integer in [1, {MAX_EPOCHS}], got {value!r}")
    return value


def predict(app: App, request: dict[str, Any]) -> dict[str, Any]:
    label_, probabilities, latency = app.model.predict(pixels(request))
    return {
        "label": label_,
        "probabilities": [float(p) for p in probabilities],
        "latency_ms": latency,
    }


def samples(app: App, request: dict[str, Any]) -> dict[str, Any]:
    x = pixels(request)
    return {"stored": app.store.add(x, label(request, app.classes))}


def personalize(app: App, request: dict[str, Any]) -> dict[str, Any]:
    return app.personalize(epochs(request))


def status(app: App, request: dict[str, Any]) -> dict[str, Any]:
    return app.status()


Handler = Callable[["App", dict[str, Any]], dict[str, Any]]
ROUTES: dict[tuple[str, str], Handler] = {
    ("POST", "/api/predict"): predict,
    ("POST", "/api/samples"): samples,
    ("POST", "/api/personalize"): personalize,
    ("GET", "/api/status"): status,
}
