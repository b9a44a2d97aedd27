"""The app and the fleet simulator say when their server is not there: the address, the
error, a retry with backoff, and the state in their status."""

from __future__ import annotations

import socket
from pathlib import Path

from sporenet.android_demo.app import App
from sporenet.android_demo.policy import Sensors
from tests.integration.android_demo.conftest import run_app
from tests.integration.federated.helpers import free_port, wait_for


def test_the_app_reports_an_unreachable_server_and_retries_with_backoff(
    digits_model: Path, digits, tmp_path: Path
):
    address = f"127.0.0.1:{free_port()}"
    app = App(digits_model, tmp_path / "data", server=address, sensors=Sensors(idle_after=0))
    assert app.participant is not None
    app.participant.min_samples = 0
    app.participant.max_backoff = 2.0
    try:
        app.start()
        status = wait_for(
            lambda: (s := app.status()["federated"])["state"] == "unreachable" and s,
            interval=0.02,
        )
        assert address in status["error"] and "refused" in status["error"].lower()
        assert status["retry_in"] is not None and status["retry_in"] >= 0
        # It keeps trying, each pause longer than the last, up to max_backoff.
        wait_for(lambda: app.participant.backoff >= 2.0, interval=0.02)
        assert app.status()["federated"]["state"] == "unreachable"
    finally:
        app.close()


def test_the_app_names_a_port_in_use_and_a_data_dir_that_is_a_file(digits_model, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = run_app(
            "--model", str(digits_model), "--data-dir", str(tmp_path / "data"), "--port", str(port)
        )
    assert out.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}: it is in use" in out.stderr
    (tmp_path / "a-file").write_text("")
    out = run_app("--model", str(digits_model), "--data-dir", str(tmp_path / "a-file"))
    assert out.returncode == 2 and "is a file; give a directory" in out.stderr
    assert "Errno" not in out.stderr
