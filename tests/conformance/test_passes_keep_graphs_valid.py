"""Every graph pass leaves a valid graph valid: run alone on each imported model of ONNX's
node suite and of the real-model corpus (benchmarks/_corpus.py, where fetched), and as
the guarded pipeline, the result passes the validator and every kernel prepares.

A model the importer rejects, or whose imported graph is already invalid, is not the
passes' business and is left out.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest

from sporenet.converter.convert import convert_onnx_model, quantized_lowering
from sporenet.converter.passes import PIPELINE, optimize
from sporenet.converter.passes.guard import problem, restore, take
from sporenet.lite.graph import Model
from tests.conformance import onnx_backend as ob

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _imported(model: onnx.ModelProto | Path, shapes: dict | None) -> Model | None:
    """The model as imported (no pass run), or None if it does not import valid."""
    try:
        ir, _ = convert_onnx_model(model, input_shapes=shapes, optimize=False)
    except Exception:  # not importable: the importer's tests cover why
        return None
    return ir if problem(ir) is None else None


def _broken_by(ir: Model) -> list[str]:
    """Each pass run alone on `ir`, then the guarded pipeline: what left it invalid."""
    start = take(ir)
    found = []
    for p in (*quantized_lowering(ir), *PIPELINE):
        restore(ir, start)
        try:
            p.run(ir)
            why = problem(ir)
        except Exception as exc:  # a pass that raises breaks the conversion too
            why = exc
        if why is not None:
            found.append(f"{p.name}: {type(why).__name__}: {why}")
    restore(ir, start)
    optimize(ir, first=quantized_lowering(ir))
    why = problem(ir)
    if why is not None:
        found.append(f"guarded pipeline: {why}")
    return found


def _node_cases(every: int) -> Iterator[ob.Case]:
    for k, case in enumerate(ob.iter_cases(("node",))):
        if k % every == 0:
            yield case


def _check_node_cases(every: int) -> None:
    checked, broken = 0, []
    for case in _node_cases(every):
        try:
            model, data_sets = case.load()  # type: ignore[operator]
        except Exception:  # a case whose data NumPy cannot hold (sequences, optionals)
            continue
        if not data_sets:
            continue
        inits = {t.name for t in model.graph.initializer}
        names = [v.name for v in model.graph.input if v.name not in inits]
        shapes = {n: np.asarray(x).shape for n, x in zip(names, data_sets[0][0], strict=False)}
        ir = _imported(model, shapes)
        if ir is None:
            continue
        checked += 1
        broken += [f"{case.name}: {b}" for b in _broken_by(ir)]
    assert checked > 100 // every, f"only {checked} node cases imported"
    assert not broken, "\n".join(broken)


@pytest.mark.slow  # about a minute: loading the suite's 1,884 cases is most of it
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the suite's own data generation
def test_passes_keep_every_node_case_valid() -> None:
    _check_node_cases(every=1)


def _corpus() -> list:  # type: ignore[type-arg]
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import _corpus
    finally:
        sys.path.remove(str(BENCHMARKS))
    return list(_corpus.CORPUS)


CORPUS = _corpus()


@pytest.mark.slow
@pytest.mark.parametrize("entry", CORPUS, ids=[m.name for m in CORPUS])
def test_passes_keep_corpus_models_valid(entry) -> None:  # type: ignore[no-untyped-def]
    import _corpus

    path = _corpus.model_path(entry)
    if path is None:
        pytest.skip("not fetched (python benchmarks/fetch_corpus.py)")
    ir = _imported(path, None) or _imported(path, entry.conversion_shapes())
    if ir is None:
        pytest.skip("does not import to a valid graph (see benchmarks/real_models.py)")
    assert not _broken_by(ir)
