"""lite.kernels.quiet: one ufunc call with floating-point errors ignored."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from sporenet.lite.kernels import quiet


@pytest.mark.parametrize("call", [quiet.quietly, quiet._errstate_call], ids=["fast", "errstate"])
def test_quietly_gives_ieee_results_without_warnings_and_restores_the_state(call):
    x = np.array([1000.0, -1.0, 0.0, np.nan], np.float32)
    out = np.empty_like(x)
    before = np.geterr()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        call(np.exp, x, out=out)
        np.testing.assert_array_equal(out, [np.inf, np.exp(np.float32(-1.0)), 1.0, np.nan])
        call(np.reciprocal, x, out=out)
        assert out[2] == np.inf
        call(np.log, x, out=out)
        assert np.isnan(out[1]) and out[2] == -np.inf
    assert np.geterr() == before
    with np.errstate(over="raise"), pytest.raises(FloatingPointError):
        np.exp(x, out=out)  # the caller's own state holds outside the call


def test_quietly_restores_the_state_when_the_call_fails():
    before = np.geterr()
    with pytest.raises(ValueError):
        quiet.quietly(np.exp, np.ones(3), out=np.empty(2))
    assert np.geterr() == before
