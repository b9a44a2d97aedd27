"""The page in a real browser (Debian's chromium driven by chromedriver) at phone and
desktop sizes.

Draws a digit on the canvas, checks the prediction, its confidence bars and the 8x8
sample the server stored; an error appears beside the button that caused it; a
personalization shows its progress and the before/after accuracy with the number of
held-out samples; the federated state is in words. At each size the layout is checked
(every element visible, inside the page width, no overlaps) and a full-page screenshot
is taken and checked by pixel (the bars drawn in the accent colour, the error box in its
colour, the stroke on the canvas).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.browser import browser, check_layout, has_colour, region, screenshot

ACCENT = (0x2F, 0x6F, 0x5E)
WARN_SOFT = (0xFB, 0xE6, 0xDF)
CARDS = ["draw-card", "result-card", "teach-card", "personalize-card", "fleet-card", "about"]


def draw_a_one(driver) -> None:
    """One vertical stroke down the middle of the canvas, by pointer (mouse or touch)."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    pad = driver.find_element(By.ID, "pad")
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", pad)
    h = pad.size["height"]
    (
        ActionChains(driver)
        .move_to_element_with_offset(pad, 0, -int(h * 0.35))
        .click_and_hold()
        .move_by_offset(0, int(h * 0.23))
        .move_by_offset(0, int(h * 0.23))
        .move_by_offset(0, int(h * 0.24))
        .release()
        .perform()
    )


@pytest.mark.parametrize("size", ["phone", "desktop"])
def test_the_page_at_phone_and_desktop_size(size, running_app, digits, tmp_path: Path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    with browser(tmp_path / "profile", size) as driver:
        driver.get(running_app.url)
        wait = WebDriverWait(driver, 30)
        text = lambda i: driver.find_element(By.ID, i).text  # noqa: E731
        wait.until(lambda d: text("version").startswith("model ") and text("version") != "model -")
        assert "Draw one digit" in text("draw-card")
        assert "Draw a digit to see the prediction" in text("result-card")
        assert "Not taking part" in text("fleet-text")
        # An error shows beside the control that caused it, not elsewhere on the page.
        driver.find_element(By.ID, "save").click()
        wait.until(lambda d: text("save-error") != "")
        assert "Draw a digit first" in text("save-error")
        near = check_layout(driver, ["save", "save-error"], [])
        assert 0 <= near["save-error"].top - near["save"].bottom < 60

        draw_a_one(driver)
        wait.until(lambda d: text("prediction").strip() != "")
        label = int(text("prediction"))
        assert 0 <= label <= 9 and text("confidence").endswith("% sure")
        assert "ms" in text("latency")
        bars = driver.find_elements(By.CSS_SELECTOR, "#bars .bar")
        assert len(bars) == 10 and len(driver.find_elements(By.CSS_SELECTOR, ".bar.top")) == 1
        driver.execute_script("document.getElementById('label').value = '1'")
        driver.find_element(By.ID, "save").click()
        wait.until(lambda d: text("stored") == "1")
        assert text("save-error") == ""
        _, x, y = running_app.app.store.all()
        assert y.tolist() == [1]
        image = x[0].reshape(8, 8)
        assert image[:, 3:5].sum() > 40 and image[:, :2].sum() == 0 and image[:, 6:].sum() == 0

        # Personalize on stored samples: progress, then before/after with the held-out count.
        for k in range(14):
            running_app.app.store.add(digits.x_test[k].reshape(64), int(digits.y_test[k]))
        driver.find_element(By.ID, "epochs").clear()
        driver.find_element(By.ID, "epochs").send_keys("30")
        driver.find_element(By.ID, "personalize").click()
        wait.until(lambda d: "held-out" in text("outcome"))
        assert "On your 3 held-out samples" in text("outcome")
        assert "before" in text("outcome") and "after" in text("outcome")
        assert text("progress-text") == "done" and text("personalize-error") == ""
        wait.until(lambda d: "(yours)" in text("version"))
        # Draw again so the screenshot shows a prediction and its bars.
        draw_a_one(driver)
        wait.until(lambda d: text("prediction").strip() != "")

        controls = ["pad", "clear", "label", "save", "epochs", "personalize", "progress"]
        found = check_layout(
            driver,
            [*CARDS, *controls, "prediction", "bars", "outcome", "fleet-text"],
            [
                CARDS,
                ["pad", "preview", "clear"],
                ["label", "save"],
                ["epochs", "personalize"],
                ["prediction", "confidence", "bars", "latency"],
            ],
        )
        driver.execute_script(
            "document.getElementById('save-error').textContent = 'an error beside Save'"
        )
        found |= check_layout(driver, ["save-error"], [["save", "save-error", "stored-text"]])
        shot = screenshot(driver, tmp_path / f"app-{size}.png")
        width = driver.execute_script("return document.documentElement.clientWidth")
        scale = shot.shape[1] / width
    if size == "phone":
        assert width <= 400  # the phone viewport really is a phone's
        # One column: the cards stack in reading order.
        tops = [found[c].top for c in CARDS]
        assert tops == sorted(tops)
    else:
        assert found["result-card"].left > found["draw-card"].right  # two columns
    # The screenshot shows what the DOM says: ink on the canvas, the top bar in the
    # accent colour, the error box in its colour, and a white card background.
    pad = region(shot, found["pad"], scale)
    assert (pad.min(axis=-1) < 60).mean() > 0.03 and (pad.min(axis=-1) > 240).mean() > 0.5
    assert has_colour(region(shot, found["bars"], scale), ACCENT)
    assert has_colour(region(shot, found["save-error"], scale), WARN_SOFT)
    assert has_colour(region(shot, found["outcome"], scale), (0xD8, 0xEB, 0xE4))


@pytest.mark.slow  # a third browser; test_any_model checks the 409 and the reason
def test_a_model_without_a_head_predicts_and_the_page_says_why_it_cannot_personalize(
    tmp_path: Path,
):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from sporenet import lite
    from sporenet.android_demo.app import App
    from tests.integration.android_demo.conftest import RunningApp

    b = lite.ModelBuilder()
    b.output(b.op(lite.OpCode.RELU, [b.input("input", (-1, 64))]), name="logits")
    lite.save(b.build(), tmp_path / "no_head.spore")
    running = RunningApp(App(tmp_path / "no_head.spore", tmp_path / "data"))
    try:
        with browser(tmp_path / "profile", "phone") as driver:
            driver.get(running.url)
            wait = WebDriverWait(driver, 30)
            note = lambda d: d.find_element(By.ID, "personalize-note").text  # noqa: E731
            wait.until(lambda d: "cannot be personalized" in note(d))
            assert "no layer with float weights" in note(driver)
            assert not driver.find_element(By.ID, "personalize").is_enabled()
            draw_a_one(driver)
            wait.until(lambda d: d.find_element(By.ID, "prediction").text.strip() != "")
            assert len(driver.find_elements(By.CSS_SELECTOR, "#bars .bar")) == 64
            check_layout(driver, ["personalize-note", "prediction", "bars"], [CARDS])
    finally:
        running.close()
