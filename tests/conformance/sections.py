"""Marked sections of a shared Markdown file (docs/conformance.md): each report writer
replaces only the text between its own markers, so the ONNX and TFLite writers keep
each other's sections."""

from __future__ import annotations

from pathlib import Path


def write_section(path: Path, begin: str, end: str, body: str) -> None:
    """Put `body` between the `begin` and `end` marker lines of `path`, in place of what
    was there, or append the marked section when the file has none."""
    section = f"{begin}\n{body.strip(chr(10))}\n{end}\n"
    text = path.read_text() if path.exists() else ""
    if begin in text and end in text.split(begin, 1)[1]:
        head, rest = text.split(begin, 1)
        tail = rest.split(end, 1)[1].lstrip("\n")
        text = head + section + ("\n" + tail if tail else "")
    else:
        text = text.rstrip("\n") + ("\n\n" if text else "") + section
    path.write_text(text)
