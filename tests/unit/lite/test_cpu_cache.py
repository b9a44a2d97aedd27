"""The L2 size kernels choose loop orders by: read from sysfs, with a fallback."""

from __future__ import annotations

from pathlib import Path

import pytest

from sporenet.lite import cpu_cache


def _cache_dir(root: Path, index: int, level: int, kind: str, size: str) -> None:
    entry = root / f"index{index}"
    entry.mkdir()
    (entry / "level").write_text(f"{level}\n")
    (entry / "type").write_text(f"{kind}\n")
    (entry / "size").write_text(f"{size}\n")


@pytest.mark.parametrize(
    ("text", "size"), [("2048K", 2 << 20), ("1M", 1 << 20), ("524288", 524288), ("big", None)]
)
def test_sizes_as_sysfs_writes_them(text, size):
    assert cpu_cache._parse_size(text) == size


def test_the_unified_level_2_cache_is_read(tmp_path, monkeypatch):
    _cache_dir(tmp_path, 0, 1, "Data", "48K")
    _cache_dir(tmp_path, 1, 1, "Instruction", "32K")
    _cache_dir(tmp_path, 2, 2, "Unified", "1280K")
    monkeypatch.setattr(cpu_cache, "_SYSFS", tmp_path)
    cpu_cache.l2_bytes.cache_clear()
    try:
        assert cpu_cache.l2_bytes() == 1280 << 10
    finally:
        cpu_cache.l2_bytes.cache_clear()


def test_a_system_without_sysfs_gets_the_default(tmp_path, monkeypatch):
    monkeypatch.setattr(cpu_cache, "_SYSFS", tmp_path / "missing")
    cpu_cache.l2_bytes.cache_clear()
    try:
        assert cpu_cache.l2_bytes() == cpu_cache.DEFAULT_L2_BYTES
    finally:
        cpu_cache.l2_bytes.cache_clear()
