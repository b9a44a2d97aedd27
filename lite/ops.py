"""Op codes, re-exported from the IR schema (proto/model.fbs is the single source of truth;
scripts/gen_proto.sh writes proto/opcodes_generated.py from it)."""

from sporenet.proto.opcodes_generated import OpCode

__all__ = ["OpCode"]
