"""The README's code cannot drift: its Python snippets run against a model exported the way
the README says, and every flag its command lines show is one the command accepts."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sporenet import cloud, lite
from sporenet.lite import OpCode

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()

COMMANDS = {
    "sporenet-convert": [sys.executable, "-m", "sporenet.converter"],
    "sporenet-server": [sys.executable, "-m", "sporenet.federated.server"],
    "python examples/train_digits.py": [sys.executable, str(ROOT / "examples/train_digits.py")],
}
"""Each command the README shows in a code block with flags, and how to run it here."""


def code_blocks() -> list[tuple[str, str]]:
    """(language, text) of each fenced block of the README, in order."""
    blocks, language, lines = [], None, []
    for line in README.splitlines():
        if line.startswith("```"):
            if language is None:
                language, lines = line[3:].strip(), []
            else:
                blocks.append((language, "\n".join(lines) + "\n"))
                language = None
        elif language is not None:
            lines.append(line)
    return blocks


def python_snippets() -> list[str]:
    return [text for language, text in code_blocks() if language == "python"]


def head_names(model: lite.Model) -> list[str]:
    """The weight and bias names of the FullyConnected node producing "logits"."""
    logits = model.signature("infer").outputs["logits"]
    node = next(
        n for n in model.graphs[0].nodes if logits in n.outputs and n.op == OpCode.FULLY_CONNECTED
    )
    return [model.tensors[i].name for i in node.inputs[1:3]]


def test_python_snippets_run_on_the_exported_digits_model(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    snippets = python_snippets()
    assert len(snippets) >= 2, "the README's Python snippets were not found"
    cloud.manual_seed(0)
    model = cloud.models.digits_cnn()
    exported = cloud.export(model, tmp_path / "digits.spore", input_shape=(1, 8, 8))
    weight, bias = head_names(exported)
    # The README's Trainer snippet names the head as the exported model does.
    assert [weight, bias] == ["head.weight", "head.bias"]
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for code in snippets:
        exec(compile(code, "README.md", "exec"), namespace)
    probabilities = namespace["outputs"]["probabilities"]
    assert probabilities.shape == (1, 10)
    np.testing.assert_allclose(probabilities.sum(), 1.0, rtol=1e-5)
    assert np.isfinite(namespace["loss"])
    tuned = namespace["tuned"]
    before = {t.name: t.data for t in exported.tensors if t.data is not None}
    changed = {
        t.name
        for t in tuned.tensors
        if t.name in before and not np.array_equal(t.data, before[t.name])
    }
    assert changed == {weight, bias}, changed


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_flag_shown_for_a_command_is_accepted(command: str) -> None:
    lines = [
        line
        for language, text in code_blocks()
        if language in ("", "bash")
        for line in text.splitlines()
    ]
    shown: set[str] = set()
    following = False
    for line in lines:
        if line.strip().startswith(command):
            following = True
        elif not line.startswith(" "):
            following = False
        if following:
            shown.update(re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", line.split("#")[0]))
    assert shown, f"the README shows no flag of {command}"
    out = subprocess.run(
        [*COMMANDS[command], "--help"], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr
    missing = sorted(flag for flag in shown if flag not in out.stdout)
    assert not missing, f"{command} --help does not know {missing}"
