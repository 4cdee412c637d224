"""Presenter mode of the topology race on a 1920x1080 projector, in a real browser (the server of
tests/test_browser.py): four lanes fit one screen, two abreast, in large type. Saves screenshots to screenshots/."""
import urllib.parse

from test_browser import SHOTS, expect_idle, main, open_browser, pytestmark, server, sidebar  # noqa: F401
from test_browser_race import race_frame, sample_replay

DRAFTERS = ["none", "ngram", "eagle2", "medusa"]
LINK = {"prompt": "Write a Python function that reverses a string.", "drafters": ",".join(DRAFTERS), "seed": "0",
        "temperature": "0", "max_tokens": "32", "presenter": "1"}
LANES_JS = """() => [...document.querySelectorAll('.lane')].map(l => {
    const r = l.getBoundingClientRect(); return {top: r.top, bottom: r.bottom, left: r.left, width: r.width}; })"""


def test_presenter_mode_fits_four_lanes_on_one_projector_screen(server):  # noqa: F811
    from playwright.sync_api import expect, sync_playwright

    SHOTS.mkdir(exist_ok=True)
    with sync_playwright() as pw:
        browser, page = open_browser(pw)
        try:
            page.set_viewport_size({"width": 1920, "height": 1080})
            page.goto(f"{server}/race?{urllib.parse.urlencode(LINK)}")
            expect(main(page).get_by_role("button", name="Run the race")).to_be_visible(timeout=300_000)
            expect(sidebar(page)).to_be_hidden()  # presenter mode from the link
            expect_idle(page)
            main(page).get_by_role("button", name="Run the race").click()
            frame = race_frame(page)
            end = max(lane["finish_s"] for lane in frame.evaluate(
                "() => JSON.parse(document.getElementById('race-data').textContent)")["lanes"])
            sample_replay(page, frame, end)
            expect_idle(page)
            page.evaluate("() => window.scrollTo(0, 0)")
            page.wait_for_timeout(700)
            page.screenshot(path=str(SHOTS / "race-presenter-1920x1080.png"))
            assert frame.evaluate("() => document.body.classList.contains('presenter')")
            assert float(frame.evaluate("() => getComputedStyle(document.body).fontSize").removesuffix("px")) >= 22
            box = page.locator("iframe[title^=\"The race's lanes\"]").bounding_box()
            lanes = [{**lane, "top": lane["top"] + box["y"], "bottom": lane["bottom"] + box["y"]}
                     for lane in frame.evaluate(LANES_JS)]
            assert len(lanes) == 4
            assert all(lane["bottom"] <= 1080 for lane in lanes), (box, lanes)  # all four on the first screen
            assert lanes[0]["top"] == lanes[1]["top"] and lanes[0]["left"] < lanes[1]["left"]  # side by side
            assert all(lane["width"] < 0.55 * box["width"] for lane in lanes)
        finally:
            browser.close()
