"""A real browser for page tests: Debian's chromium driven by chromedriver (selenium), at
phone and desktop sizes, with layout checks and full-page screenshots checked by pixel.

Tests that use it skip with a reason where chromium, chromedriver, selenium or matplotlib
(which decodes the screenshots) is missing.
"""

from __future__ import annotations

import base64
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
SIZES = {"phone": (390, 844), "desktop": (1280, 900)}
"""Viewport sizes: a common phone (CSS pixels) and a laptop window."""
SCREENSHOTS_ENV = "SPORENET_SCREENSHOTS"
"""Set to a directory to keep the screenshots the tests take (for a person to look at)."""


def require_browser() -> Any:
    """selenium's webdriver module, or skip the test saying what is missing."""
    webdriver = pytest.importorskip(
        "selenium.webdriver", reason="selenium is not installed (the test extra installs it)"
    )
    pytest.importorskip("matplotlib", reason="matplotlib decodes the screenshots (test extra)")
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.skip(
            "chromium and chromedriver are not installed (apt-get install chromium "
            "chromium-driver; .ci/run does it)"
        )
    return webdriver


@contextmanager
def browser(profile: Path, size: str) -> Iterator[Any]:
    """A headless chromium with a viewport of SIZES[size] (a phone is emulated: touch,
    mobile viewport)."""
    webdriver = require_browser()
    width, height = SIZES[size]
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
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        f"--window-size={width},{height}",
    ):
        options.add_argument(flag)
    if size == "phone":
        options.add_experimental_option(
            "mobileEmulation",
            {"deviceMetrics": {"width": width, "height": height, "pixelRatio": 2.0}},
        )
    driver = webdriver.Chrome(
        options=options, service=webdriver.ChromeService(executable_path=CHROMEDRIVER)
    )
    try:
        yield driver
    finally:
        driver.quit()


@dataclass(frozen=True)
class Box:
    """An element's box in CSS pixels of the page (not the viewport)."""

    id: str
    left: float
    top: float
    width: float
    height: float

    @property
    def right(self) -> float:
        return self.left + self.width

    @property
    def bottom(self) -> float:
        return self.top + self.height

    def overlaps(self, other: Box) -> bool:
        return (
            min(self.right, other.right) - max(self.left, other.left) > 0.5
            and min(self.bottom, other.bottom) - max(self.top, other.top) > 0.5
        )


def boxes(driver: Any, ids: list[str]) -> dict[str, Box]:
    """The page boxes of the elements with these ids (every one must exist)."""
    rects = driver.execute_script(
        "return arguments[0].map((id) => { const e = document.getElementById(id);"
        " if (!e) return null; const r = e.getBoundingClientRect();"
        " return [r.left + scrollX, r.top + scrollY, r.width, r.height]; });",
        ids,
    )
    missing = [i for i, r in zip(ids, rects, strict=True) if r is None]
    assert not missing, f"no element with id {missing}"
    return {i: Box(i, *r) for i, r in zip(ids, rects, strict=True)}


def check_layout(driver: Any, visible: list[str], apart: list[list[str]]) -> dict[str, Box]:
    """Every `visible` element has a size and lies within the page's width, the page has
    no horizontal scroll, and the elements of each group in `apart` do not overlap."""
    width = driver.execute_script("return document.documentElement.clientWidth")
    scroll = driver.execute_script("return document.documentElement.scrollWidth")
    assert scroll <= width + 1, f"the page scrolls sideways: {scroll} px wide in {width}"
    found = boxes(driver, sorted({*visible, *(i for g in apart for i in g)}))
    for i in visible:
        b = found[i]
        assert b.width > 0 and b.height > 0, f"#{i} is not visible: {b}"
        assert b.left >= -1 and b.right <= width + 1, f"#{i} sticks out of the page: {b}"
    for group in apart:
        for k, a in enumerate(group):
            for b in group[k + 1 :]:
                assert not found[a].overlaps(found[b]), f"#{a} overlaps #{b}"
    return found


def screenshot(driver: Any, path: Path) -> np.ndarray:
    """A screenshot of the whole page (beyond the viewport) saved as PNG at `path`, and its
    pixels as an (H, W, 3) uint8 array; copied to $SPORENET_SCREENSHOTS when set."""
    import matplotlib.image

    metrics = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})
    size = metrics["cssContentSize"]
    shot = driver.execute_cdp_cmd(
        "Page.captureScreenshot",
        {
            "format": "png",
            "captureBeyondViewport": True,
            "clip": {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1},
        },
    )
    path.write_bytes(base64.b64decode(shot["data"]))
    keep = os.environ.get(SCREENSHOTS_ENV)
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(keep) / path.name)
    image = matplotlib.image.imread(path)  # float in [0, 1], RGB or RGBA
    return np.round(image[..., :3] * 255).astype(np.uint8)


def region(image: np.ndarray, box: Box, scale: float) -> np.ndarray:
    """The pixels of `box` (CSS pixels) in a screenshot taken at `scale` device pixels."""
    top, left = int(box.top * scale), int(box.left * scale)
    return image[top : int(box.bottom * scale), left : int(box.right * scale)]


def has_colour(pixels: np.ndarray, rgb: tuple[int, int, int], tolerance: int = 12) -> bool:
    """Whether some pixel is within `tolerance` of `rgb` in every channel."""
    return bool((np.abs(pixels.astype(int) - rgb).max(axis=-1) <= tolerance).any())
