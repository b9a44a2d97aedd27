#!/usr/bin/env bash
# Regenerates the committed bindings from proto/model.fbs and proto/federated.proto.
# Needs the dev extra (flatc, grpcio-tools). tests/unit/test_generated_bindings.py fails
# when the committed files drift from what this script produces.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-proto}"
flatc --python --gen-onefile --python-typing -o "$out" proto/model.fbs
if [ -f proto/federated.proto ]; then
  python -m grpc_tools.protoc -Iproto_src=proto --python_out="$out" --grpc_python_out="$out" \
    proto/federated.proto >/dev/null
fi
