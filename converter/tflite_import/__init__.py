"""TFLite import: .tflite flatbuffers (float32, float16 weights, int8) into the IR."""
