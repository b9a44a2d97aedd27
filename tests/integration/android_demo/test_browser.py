"""The page in a real browser: Debian's chromium driven by chromedriver (selenium).

Draws a digit on the canvas with the mouse, checks that the prediction, its confidence
and latency appear and that the 8x8 downsample the page sent is what the server stored,
then saves a screenshot and checks it is a well-formed, non-blank PNG.
"""

from __future__ import annotations

import shutil
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
webdriver = pytest.importorskip(
    "selenium.webdriver", reason="selenium is not installed (the test extra installs it)"
)
pytestmark = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="chromium and chromedriver are not installed (apt-get install chromium "
    "chromium-driver; .ci/run does it)",
)


def png_image_data(data: bytes) -> tuple[int, int, np.ndarray]:
    """(width, height, decompressed filtered scanlines) of a PNG, checking its structure."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks, header = 8, [], None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + length]
        assert (
            zlib.crc32(kind + body)
            == struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])[0]
        )
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            chunks.append(body)
        pos += 12 + length
    assert header is not None
    width, height = header[0], header[1]
    return width, height, np.frombuffer(zlib.decompress(b"".join(chunks)), np.uint8)


def test_draw_predict_and_screenshot(running_app, tmp_path: Path):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--no-first-run",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--window-size=800,900",
    ):
        options.add_argument(flag)
    service = webdriver.ChromeService(executable_path=CHROMEDRIVER)
    driver = webdriver.Chrome(options=options, service=service)
    try:
        driver.get(running_app.url)
        pad = driver.find_element(By.ID, "pad")
        # A "1": one vertical stroke down the middle of the 256x256 canvas.
        (
            ActionChains(driver)
            .move_to_element_with_offset(pad, 0, -90)
            .click_and_hold()
            .move_by_offset(0, 60)
            .move_by_offset(0, 60)
            .move_by_offset(0, 60)
            .release()
            .perform()
        )
        wait = WebDriverWait(driver, 30)
        wait.until(lambda d: d.find_element(By.ID, "prediction").text.strip() != "")
        label = int(driver.find_element(By.ID, "prediction").text)
        assert 0 <= label <= 9
        assert driver.find_element(By.ID, "confidence").text.endswith("%")
        assert "ms" in driver.find_element(By.ID, "latency").text
        # Correct the label and save: the server stores what the page downsampled.
        driver.execute_script("document.getElementById('label').value = '1'")
        driver.find_element(By.ID, "save").click()
        wait.until(lambda d: d.find_element(By.ID, "stored").text == "1")
        _, x, y = running_app.app.store.all()
        assert y.tolist() == [1]
        image = x[0].reshape(8, 8)
        assert image[:, 3:5].sum() > 40 and image[:, :2].sum() == 0 and image[:, 6:].sum() == 0
        shot = tmp_path / "page.png"
        assert driver.save_screenshot(str(shot))
    finally:
        driver.quit()
    width, height, scanlines = png_image_data(shot.read_bytes())
    assert width > 100 and height > 100 and scanlines.size >= width * height * 3
    # A blank page filters to a few byte values; text, the stroke and the preview to many.
    assert len(np.unique(scanlines)) > 64
