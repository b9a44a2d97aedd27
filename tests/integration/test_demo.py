"""The README's main job, `python -m sporenet.demo`, runs end to end as a real subprocess."""

import re
import subprocess
import sys
from pathlib import Path


def test_demo_runs_every_stage_and_writes_a_valid_model(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "sporenet.demo",
            "--out",
            str(tmp_path),
            "--epochs",
            "4",
            "--rounds",
            "2",
            "--clients",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    for stage in ("[1/4] cloud", "[2/4] device", "[3/4] device", "[4/4] fleet"):
        assert any(line.startswith(stage) for line in lines), out.stdout
    # The first line comes before any training: the demo shows progress from its start.
    assert lines[0].startswith("[1/4] cloud: training"), out.stdout
    assert sum(line.startswith("[1/4] cloud: epoch ") for line in lines) == 4, out.stdout
    trained = next(line for line in lines if line.startswith("[1/4] cloud: trained"))
    cloud_acc = float(re.search(r"test accuracy (\d\.\d+)", trained).group(1))
    assert cloud_acc > 0.8  # 4 epochs reach ~0.95; far above the 0.1 of chance
    assert "backbone unchanged: True" in out.stdout
    int8 = next(line for line in lines if line.startswith("[2/4] device: int8"))
    found = re.search(r"(\d\.\d+)x the float file, test accuracy (\d\.\d+)", int8)
    ratio, int8_acc = found.groups()
    assert float(ratio) < 0.35 and float(int8_acc) > cloud_acc - 0.05, int8
    rounds = re.findall(r"round (\d): (\d\.\d+)", out.stdout)
    assert [r for r, _ in rounds] == ["1", "2"]
    from sporenet import lite

    model = lite.load(tmp_path / "digits.spore")
    assert "labels" in model.metadata
