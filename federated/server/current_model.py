"""The job's current model: its bytes, weights, update template and optimizer moments.

Each published version differs from the last only in its weights, so the weights are
read-only views of the model's bytes (parsed once per structure by `WeightsReader`),
and only trainable tensors are federated (all float constants when none is flagged):
the others (input scaling, frozen statistics) stay as the initial model has them.
"""

from __future__ import annotations

import itertools

import numpy as np

from sporenet.federated.aggregation import Template, Weights, template_of
from sporenet.federated.errors import ConfigError, ModelDamagedError
from sporenet.federated.server.models import ModelStore
from sporenet.federated.server.state import ModelRecord, Store
from sporenet.lite import ModelFormatError, WeightsReader, replace_weights_bytes


class CurrentModel:
    """The version clients train now (`load` it before use)."""

    def __init__(self, models: ModelStore, max_update_bytes: int | None) -> None:
        self._models = models
        self._max_update_bytes = max_update_bytes
        self._reader = WeightsReader(trainable_only=True)
        self.data = b""
        self.record = ModelRecord(0, 0, "", "", 0)
        self.weights: Weights = {}
        # Where each weight's data lie in `data` (None: not every one is a view of them).
        self._spans: dict[str, tuple[int, int]] | None = None
        self.template: Template = {}
        self.moments: dict[str, np.ndarray] = {}
        self.update_bytes = 0  # a raw update's size
        self.max_update_bytes = 0

    def load(self, store: Store, version: int) -> None:
        """Make the stored version `version` current.

        Raises:
            ConfigError: the version is missing, damaged or unreadable.
        """
        record = store.model(version)
        where = str(self._models.root)
        if record is None:
            raise ConfigError(f"state dir {where!r} lost model version {version}")
        try:
            data = self._models.read(record)
        except ModelDamagedError as e:  # the job's current model: nothing to serve or train
            raise ConfigError(str(e)) from None
        try:
            weights = self._reader.read(data)
        except ModelFormatError as e:
            raise ConfigError(
                f"state dir {where!r}: model version {version} "
                f"({str(self._models.path(record))!r}) is unreadable: {e}"
            ) from None
        self.data, self.record, self.weights = data, record, weights
        self._spans = _spans_in(data, weights)
        self.template = template_of(weights)
        self.update_bytes = sum(a.nbytes for a in weights.values())
        self.max_update_bytes = self._max_update_bytes or 2 * self.update_bytes + (1 << 20)
        self.moments = self._models.read_moments(version)

    def publish(self, data: bytes, moments: dict[str, np.ndarray], record: ModelRecord) -> None:
        """A new version was published: it is current from now on."""
        self.data, self.moments, self.record = data, moments, record
        self.weights = self._reader.read(data)
        self._spans = _spans_in(data, self.weights)

    def with_weights(self, weights: Weights) -> bytes:
        """The current model's bytes with `weights` (some of its own, by name, of the same
        shapes and dtypes) in place of its own: written at the offsets where its weights
        lie in its bytes, so nothing is parsed again (a version differs from the last only
        in its weights). Anything else goes to `lite.replace_weights_bytes`, which parses
        the model, splices or serializes it, and says what does not match."""
        spans = self._spans
        if (
            spans is None
            or not set(weights) <= set(spans)
            or not all(
                np.shape(w) == self.weights[k].shape
                and np.asarray(w).dtype == self.weights[k].dtype
                for k, w in weights.items()
            )
        ):
            return replace_weights_bytes(self.data, weights)
        data = memoryview(self.data).cast("B")
        pieces: list[bytes | memoryview] = []
        pos = 0
        for name, (start, end) in sorted(spans.items(), key=lambda kv: kv[1]):
            if name in weights:
                value = np.ascontiguousarray(weights[name])
                pieces += [data[pos:start], value.data.cast("B")]
                pos = end
        pieces.append(data[pos:])
        return b"".join(pieces)


def _spans_in(data: bytes, weights: Weights) -> dict[str, tuple[int, int]] | None:
    """(start, end) of each weight's bytes in `data`, or None unless every weight is a
    contiguous view into `data` sharing bytes with no other (then a new version is
    written at these offsets)."""
    buf = np.frombuffer(data, np.uint8)
    base = buf.ctypes.data if len(buf) else 0
    spans: dict[str, tuple[int, int]] = {}
    for name, w in weights.items():
        at = w.ctypes.data - base
        if not w.flags.c_contiguous or at < 0 or at + w.nbytes > len(buf):
            return None
        spans[name] = (at, at + w.nbytes)
    ordered = sorted(spans.values())
    if any(a[1] > b[0] for a, b in itertools.pairwise(ordered)):
        return None
    return spans
