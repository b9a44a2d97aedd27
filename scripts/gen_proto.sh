#!/usr/bin/env bash
# Regenerates the committed bindings from proto/model.fbs and proto/federated.proto.
# Needs the dev extra (flatc, grpcio-tools). tests/unit/test_generated_bindings.py fails
# when the committed files drift from what this script produces.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-proto}"
flatc --python --gen-onefile --python-typing -o "$out" proto/model.fbs
python scripts/gen_opcodes.py proto/model.fbs "$out"
if [ -f proto/federated.proto ]; then
  # Map proto/ to the virtual path sporenet/proto so the generated _grpc module imports
  # `from sporenet.proto import federated_pb2`; protoc then writes under sporenet/proto/.
  gen="$(mktemp -d)"
  trap 'rm -rf "$gen"' EXIT
  python -m grpc_tools.protoc -Isporenet/proto=proto --python_out="$gen" \
    --grpc_python_out="$gen" --pyi_out="$gen" proto/federated.proto >/dev/null
  mv "$gen"/sporenet/proto/federated_pb2* "$out"/
fi
