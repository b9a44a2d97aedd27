"""The operator's view of a job: `sporenet-server status` as text and JSON, and the status
page the daemon serves beside /metrics, read in chromium at phone and desktop sizes."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from sporenet.federated import Client
from tests.integration.browser import browser, check_layout, has_colour, region, screenshot
from tests.integration.federated.helpers import make_model, wait_for

ROUNDS = 3


def run_job(tmp_path: Path, server_factory) -> tuple[object, int]:  # type: ignore[no-untyped-def]
    """A DP job of ROUNDS fit rounds with an evaluation after each, run to its end by three
    clients; the daemon keeps serving. Returns (server, metrics port)."""
    make_model(tmp_path / "init.spore", out=3, inp=4)
    cfg = tmp_path / "server.toml"
    cfg.write_text(
        f'model = "{tmp_path / "init.spore"}"\nrounds = {ROUNDS}\nmin_clients = 3\n'
        "evaluate_every = 1\nkeep_serving = true\nmetrics_port = 0\n"
        "[differential_privacy]\nenabled = true\nnoise_multiplier = 1.0\n"
        "clipping_norm = 1.0\ndelta = 1e-5\nepsilon_budget = 50.0\n"
    )
    server = server_factory(["--config", str(cfg)]).start()
    rng = np.random.default_rng(0)

    def train(weights, config):  # type: ignore[no-untyped-def]
        return (
            {k: w + 0.01 * rng.standard_normal(w.shape) for k, w in weights.items()},
            10,
            {"loss": float(rng.uniform(0.2, 0.4))},
        )

    evaluations = iter(np.linspace(0.9, 0.3, 100))

    def evaluate(weights, config):  # type: ignore[no-untyped-def]
        loss = float(next(evaluations))
        return loss, 10, {"accuracy": 1.0 - loss / 2}

    clients = [
        Client(server.address, train=train, evaluate=evaluate, name=f"c{k}") for k in range(3)
    ]
    threads = [threading.Thread(target=c.run, daemon=True) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for c in clients:
        c.close()
    info = json.loads((server.state_dir / "server.json").read_text())
    return server, int(info["metrics_port"])


def test_status_text_json_and_the_page(tmp_path: Path, server_factory) -> None:  # type: ignore[no-untyped-def]
    server, port = run_job(tmp_path, server_factory)
    base = f"http://127.0.0.1:{port}"
    status = [sys.executable, "-m", "sporenet.federated.server", "status"]
    text = subprocess.run(
        [*status, "--state-dir", str(server.state_dir)], capture_output=True, text=True
    ).stdout
    assert text.startswith(f"job: finished after round {ROUNDS} of {ROUNDS}")
    assert "3 registered" in text and "of a budget of 50" in text
    rows = [line.split() for line in text.splitlines() if line[:5].strip().isdigit()]
    assert [int(r[0]) for r in rows] == list(range(1, ROUNDS + 1))
    full = json.loads(
        subprocess.run(
            [*status, "--json", "--state-dir", str(server.state_dir)],
            capture_output=True,
            text=True,
        ).stdout
    )
    assert full["job"]["status"] == "finished"
    served = json.loads(urllib.request.urlopen(f"{base}/status.json", timeout=30).read())
    assert served["job"] == full["job"]
    assert (
        b"sporenet_rounds_completed_total"
        in urllib.request.urlopen(f"{base}/metrics", timeout=30).read()
    )
    page = urllib.request.urlopen(f"{base}/", timeout=30).read().decode()
    assert "finished after round 3 of 3" in page and "<svg" in page

    cards = ["job-card", "participants-card", "rounds-card", "privacy-card", "events-card"]
    for size in ("phone", "desktop"):
        with browser(tmp_path / f"profile-{size}", size) as driver:
            from selenium.webdriver.common.by import By

            driver.get(base + "/")
            wait_for(lambda: driver.find_elements(By.ID, "plot"), what="the page")
            found = check_layout(
                driver,
                [*cards, "phase", "participants", "plot", "rounds", "privacy", "events"],
                [cards],
            )
            phase = driver.find_element(By.ID, "phase").text
            assert phase.startswith(f"finished after round {ROUNDS} of {ROUNDS}")
            assert "3 accepted" in driver.find_element(By.ID, "participants").text
            body = driver.find_elements(By.CSS_SELECTOR, "#rounds tbody tr")
            assert len(body) == ROUNDS
            assert "of a budget of 50" in driver.find_element(By.ID, "privacy").text
            meter = driver.find_element(By.ID, "privacy-meter")
            assert 0 < float(meter.get_attribute("value")) <= 50
            events = driver.find_element(By.ID, "events").text
            assert "round_published" in events or "job_finished" in events
            # Two polylines (accuracy, loss), each with a point per round.
            assert len(driver.find_elements(By.CSS_SELECTOR, "#plot polyline")) == 2
            assert len(driver.find_elements(By.CSS_SELECTOR, "#plot circle")) == 2 * ROUNDS
            shot = screenshot(driver, tmp_path / f"status-{size}.png")
            scale = shot.shape[1] / driver.execute_script(
                "return document.documentElement.clientWidth"
            )
        plot = region(shot, found["plot"], scale)
        assert has_colour(plot, (0x2F, 0x6F, 0x5E)) and has_colour(plot, (0xC0, 0x55, 0x2F))
        if size == "desktop":
            assert found["participants-card"].left > found["job-card"].right
    server.terminate()


@pytest.mark.parametrize("args", [["--version"], ["status", "--version"]])
def test_version_everywhere(args: list[str]) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "sporenet.federated.server", *args], capture_output=True, text=True
    )
    assert out.returncode == 0 and out.stdout.strip()


@pytest.mark.slow  # a cloud and an edge daemon: the server's page is tested in the default run
def test_the_edge_serves_the_page_for_its_own_rounds(
    tmp_path: Path,
    server_factory,  # type: ignore[no-untyped-def]
    edge_factory,  # type: ignore[no-untyped-def]
) -> None:
    make_model(tmp_path / "init.spore", out=3, inp=4)
    cloud = server_factory(
        ["--model", str(tmp_path / "init.spore"), "--rounds", "1", "--min-clients", "1"]
    ).start()
    edge = edge_factory("edge", cloud.address, ["--metrics-port", "0", "--min-clients", "2"])
    edge.start()
    edge.wait_serving()
    info = json.loads((edge.state_dir / "server.json").read_text())
    base = f"http://127.0.0.1:{info['metrics_port']}"

    def page() -> str:
        return urllib.request.urlopen(f"{base}/", timeout=30).read().decode()

    # No device has come: the edge's round 1 waits, and the page says so in words.
    wait_for(lambda: "waiting for clients" in page(), what="the edge's page")
    text = page()
    assert f"sporenet-edge {edge.address}" in text
    assert "round 1: waiting for clients before training (fit) starts (needs 2 live" in text
    status = json.loads(urllib.request.urlopen(f"{base}/status.json", timeout=30).read())
    assert status["job"]["active"] is False
