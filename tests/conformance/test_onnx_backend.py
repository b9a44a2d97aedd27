"""ONNX backend conformance through sporenet-convert and the lite Interpreter.

Each case whose op types the converter lists is converted and run, and its outputs are
compared with the suite's expected outputs at the suite's own tolerances. Excluded cases
are skipped with the reason from EXCLUDED; known failures are strict xfails. The summary
table: `python -m tests.conformance.onnx_backend`.
"""

from __future__ import annotations

import pytest

from tests.conformance import onnx_backend as ob

pytest.importorskip("onnxruntime", reason="test extra")


def _supported(kinds: tuple[str, ...]) -> list[ob.Case]:
    cases = []
    for case in ob.iter_cases(kinds):
        assert case.model is not None
        if all(ob.is_supported(op) for op in ob.case_ops(case.model)):
            cases.append(case)
    return cases


def _params(kinds: tuple[str, ...], slow: tuple[str, ...] = ()) -> list:
    params = []
    for case in _supported(kinds):
        marks = []
        if case.name.removeprefix("light_") in slow:
            marks.append(pytest.mark.slow)
        known = ob.exclusion(case.name, ob.KNOWN_FAILURES)
        if known is not None:
            marks.append(pytest.mark.xfail(reason=known, strict=True))
        params.append(pytest.param(case, id=case.name, marks=marks))
    return params


def _check(case: ob.Case) -> None:
    reason = ob.exclusion(case.name)
    if reason is not None:
        pytest.skip(f"excluded: {reason}")
    error = ob.run_case(case)
    assert error is None, error


@pytest.mark.parametrize("case", _params(("node",)))
def test_node(case: ob.Case) -> None:
    _check(case)


@pytest.mark.parametrize("case", _params(("pytorch-converted", "pytorch-operator")))
def test_pytorch(case: ob.Case) -> None:
    _check(case)


@pytest.mark.parametrize("case", _params(("light",), slow=ob.SLOW_LIGHT_MODELS))
def test_light_model(case: ob.Case) -> None:
    _check(case)


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(
            n, id=f"light_{n}", marks=[pytest.mark.slow] if n in ob.SLOW_LIGHT_MODELS else []
        )
        for n in ob.LIGHT_MODELS
    ],
)
def test_optimized_and_unoptimized_light_models_agree(name: str) -> None:
    """The passes (BatchNorm folding, fusion, ...) keep outputs within 1e-5 relative.

    Uses a copy of the model with random weights: the light models' constant weights make
    all 1000 logits equal (~1e10), so their softmax depends on last-bit rounding.
    """
    import os

    import numpy as np

    from sporenet.converter import convert_onnx
    from sporenet.lite import Interpreter

    model = ob.with_real_weights(
        ob.onnx.load(os.path.join(ob.DATA_DIR, "light", f"light_{name}.onnx"))
    )
    feed = ob.light_input(model)[0]
    outputs = []
    for optimize in (True, False):
        interpreter = Interpreter(model_content=convert_onnx(model, optimize=optimize))
        (input_name,) = interpreter.signature.inputs
        outputs.append(next(iter(interpreter.run({input_name: feed}).values())))
    scale = float(np.max(np.abs(outputs[1])))
    np.testing.assert_allclose(outputs[0], outputs[1], rtol=1e-5, atol=1e-5 * scale)


def test_tied_logit_softmax_is_judged_by_its_logits() -> None:
    """The light-model fallback accepts any distribution over exactly tied logits and
    nothing else: a different output, or untied (random-weight) logits, still fail."""
    import os

    import numpy as np

    model = ob.onnx.load(os.path.join(ob.DATA_DIR, "light", "light_squeezenet.onnx"))
    feed = ob.light_input(model)[0]
    (input_name,) = [
        v.name for v in model.graph.input if v.name not in {t.name for t in model.graph.initializer}
    ]
    shapes, feeds = {input_name: feed.shape}, {input_name: feed}
    out = model.graph.output[0].name
    one_hot = np.zeros((1, 1000), np.float32)
    one_hot[0, 7] = 1.0
    assert ob._softmax_of_tied_logits(model, shapes, feeds, out, one_hot)
    assert not ob._softmax_of_tied_logits(model, shapes, feeds, out, one_hot * 2)  # not a pmf
    real = ob.with_real_weights(model)
    assert not ob._softmax_of_tied_logits(real, shapes, feeds, out, one_hot)
