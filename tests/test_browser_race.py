"""The topology race in a real browser: `streamlit run app.py` with the embedded SmolLM2 model (the server of
tests/test_browser.py), a prepared race link opened and started in Chromium, the lanes sampled as they replay.
Saves screenshots to screenshots/; with SPECVIZ_README_SHOT=1 also the README's picture of the reference race,
docs/img/race-regimes.png."""
import os
import re
import urllib.parse

from test_browser import ROOT, SHOTS, expect_idle, main, open_browser, pytestmark, server, shot, sidebar  # noqa: F401

DRAFTERS = ["none", "ngram", "eagle2"]
LINK = {"prompt": "Write a Python function that reverses a string.", "drafters": ",".join(DRAFTERS), "seed": "0",
        "temperature": "0", "max_tokens": "24"}
LANES_JS = """() => [...document.querySelectorAll('.lane')].map(l => ({
    drafter: l.dataset.drafter, tokens: +l.dataset.tokens, steps: +l.dataset.steps, finished: l.dataset.finished === '1'}))"""
DATA_JS = "() => JSON.parse(document.getElementById('race-data').textContent)"


def race_frame(page):
    """The race document's frame (an iframe whose srcdoc the page wrote)."""
    handle = page.locator("iframe[title^=\"The race's lanes\"]").element_handle(timeout=240_000)
    frame = handle.content_frame()
    frame.wait_for_selector(".lane")
    return frame


def sample_replay(page, frame, seconds: float, every_ms: int = 150) -> list[list[dict]]:
    """The lanes' state every `every_ms` until every lane has finished (within `seconds` and some slack)."""
    samples = []
    for _ in range(int((seconds + 30) * 1000 / every_ms)):
        samples.append(frame.evaluate(LANES_JS))
        if all(lane["finished"] for lane in samples[-1]):
            return samples
        page.wait_for_timeout(every_ms)
    raise AssertionError(f"the replay did not finish: {samples[-1]}")


def test_a_prepared_race_link_replays_the_lanes_at_their_measured_timings(server):  # noqa: F811
    from playwright.sync_api import expect, sync_playwright

    SHOTS.mkdir(exist_ok=True)
    with sync_playwright() as pw:
        browser, page = open_browser(pw)
        try:
            page.goto(f"{server}/race?{urllib.parse.urlencode(LINK)}")
            expect(sidebar(page).get_by_text("Drafter", exact=True)).to_be_visible(timeout=300_000)  # model loaded (a busy machine)
            expect_idle(page)
            expect(page.get_by_role("textbox", name="Prompt")).to_have_value(LINK["prompt"])  # the link prefilled it
            expect(page.get_by_role("spinbutton", name="Max new tokens")).to_have_value("24")
            for name in DRAFTERS:
                expect(main(page).get_by_text(name, exact=True).first).to_be_visible()
            main(page).get_by_role("button", name="Run the race").click()
            frame = race_frame(page)
            data = frame.evaluate(DATA_JS)
            assert [lane["drafter"] for lane in data["lanes"]] == DRAFTERS

            # restarted (slowed to 0.25x when the whole race took under 4 s), the lanes are sampled as they fill
            end = max(lane["finish_s"] for lane in data["lanes"])
            speed = 0.25 if end < 4 else 1
            frame.select_option("#race-speed", str(speed))
            frame.click("#race-restart")
            samples = sample_replay(page, frame, end / speed)
            totals = [sum(lane["tokens"] for lane in s) for s in samples]
            assert totals == sorted(totals) and len(set(totals)) >= 4, totals  # grew over time, not all at once
            final = {lane["drafter"]: lane["tokens"] for lane in samples[-1]}
            assert final == {lane["drafter"]: lane["new_tokens"] for lane in data["lanes"]}
            finished_at = {d: next(i for i, s in enumerate(samples) if s[k]["finished"]) for k, d in enumerate(DRAFTERS)}
            # in measured order: a lane that finished more than half a second of replay before another is seen
            # finished no later (closer finishes may swap: the samples are 150 ms apart plus a busy browser's lag)
            tolerance_s = 0.5 * speed
            finish = {lane["drafter"]: lane["finish_s"] for lane in data["lanes"]}
            late = [(a, b) for a in DRAFTERS for b in DRAFTERS
                    if finish[a] + tolerance_s < finish[b] and finished_at[a] > finished_at[b]]
            assert not late, (late, finished_at, finish)
            expect(page.get_by_text(re.compile("every lane produced exactly the same text as"))).to_be_visible()
            shot(page, "race-1-finished")

            # step by step: each press moves the clock to the next moment a lane commits tokens
            frame.click("#race-restart")
            frame.click("#race-play")  # pause at once
            frame.click("#race-back")
            frame.click("#race-back")
            first_step = min(s["t"] for lane in data["lanes"] for s in lane["steps"][:1])
            steps = []
            for _ in range(3):
                frame.click("#race-next")
                steps.append(sum(lane["steps"] for lane in frame.evaluate(LANES_JS)))
            assert steps[0] >= 1 and steps[0] < steps[1] < steps[2], steps  # at least one lane's step each time
            assert float(frame.evaluate("() => document.body.dataset.clock")) > first_step

            main(page).get_by_text("Presenter mode").click()
            expect_idle(page)
            expect(sidebar(page)).to_be_hidden()
            frame = race_frame(page)
            assert frame.evaluate("() => document.body.classList.contains('presenter')")
            sample_replay(page, frame, end)  # the presenter's copy plays at 1x from its start
            shot(page, "race-2-presenter")
            page.set_viewport_size({"width": 1400, "height": 1500})  # all of it on screen: an iframe off screen is not painted
            page.wait_for_timeout(700)
            main(page).screenshot(path=str(SHOTS / "race-3-whole.png"))
            print(f"\nscreenshots: {SHOTS}")
        finally:
            browser.close()


def test_the_reference_race_loads_in_one_click_and_shows_both_regimes(server):  # noqa: F811
    """The shipped reference race (assets/race-regimes.zip, scripts/reference_race.py): one click in the bundle
    expander replays `none` and eagle2 on both weight sets, each lane named with its weights, and the page says where
    and when it was measured. With SPECVIZ_README_SHOT=1 it is also the README's picture, docs/img/race-regimes.png."""
    from playwright.sync_api import expect, sync_playwright

    assert (ROOT / "assets" / "race-regimes.zip").is_file(), "the reference race is shipped in assets/"
    SHOTS.mkdir(exist_ok=True)
    with sync_playwright() as pw:
        browser, page = open_browser(pw)
        try:
            page.goto(f"{server}/race")
            expect(sidebar(page).get_by_text("Drafter", exact=True)).to_be_visible(timeout=300_000)
            expect_idle(page)
            main(page).get_by_text("Replay a saved race bundle").click()
            replaying = main(page).get_by_text(re.compile("Replaying the bundle")).first
            for _ in range(3):  # a click that lands while the page reruns can be lost: press again until it shows
                main(page).get_by_role("button", name=re.compile("Load the reference race")).click()
                expect_idle(page)
                try:
                    expect(replaying).to_be_visible(timeout=30_000)
                    break
                except AssertionError:
                    continue
            expect(replaying).to_be_visible()
            frame = race_frame(page)
            data = frame.evaluate(DATA_JS)
            names = [lane["drafter"] for lane in data["lanes"]]
            assert sorted(names) == sorted(f"{d}@{w}" for d in ("none", "eagle2") for w in ("q4q8", "fp32")), names
            expect(main(page).get_by_text(re.compile("measured on machine: .*cores")).first).to_be_visible()
            end = max(lane["finish_s"] for lane in data["lanes"])
            sample_replay(page, frame, end)
            # presenter mode keeps the loaded race: its four lanes on one projector screen
            page.set_viewport_size({"width": 1920, "height": 1080})
            main(page).get_by_text("Presenter mode").click()
            expect_idle(page)
            frame = race_frame(page)
            assert len(frame.evaluate(DATA_JS)["lanes"]) == 4
            sample_replay(page, frame, end)
            page.wait_for_timeout(700)
            readme = os.environ.get("SPECVIZ_README_SHOT") == "1"
            target = ROOT / "docs" / "img" / "race-regimes.png" if readme else SHOTS / "race-regimes.png"
            page.screenshot(path=str(target))
        finally:
            browser.close()
