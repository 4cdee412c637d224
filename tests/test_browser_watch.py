"""A class watching one run: `specviz serve` with the tiny model, the app pointed at it, a presenter who shares
a run from the Live page, and Chromium pages that open the watch link (ten at a time, all kept open). Every
viewer sees the presenter's text, and the service decoded once.

Run alone it opens 3 viewer pages; `make test-room` (CI runs it; `make test` leaves it out) a room of 30, as
SPECVIZ_TEST_VIEWERS=30: on two cores a page costs about 5 s of the run."""
import os
import re
import sys

import httpx
from test_browser import SHOTS, expect_idle, free_port, main, open_browser, process, pytestmark, sidebar, streamlit, wait_for  # noqa: F401

VIEWERS = int(os.environ.get("SPECVIZ_TEST_VIEWERS", "3"))
BATCH = 10  # pages opened at once: thirty Streamlit pages loading together starve a 2-core machine
TOKENS_JS = "() => [...document.querySelectorAll('.specviz-token')].map(t => t.textContent).join('')"
FINISHED = re.compile(r"stopped: (eos|max_new_tokens)")


def runs_done(url: str) -> float:
    text = httpx.get(url + "/metrics").text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith("specviz:runs_total{"))


def shown_text(page) -> str:
    """The run's text once the page has drawn it to the end (the same for two looks a second apart)."""
    from playwright.sync_api import expect

    expect(page.get_by_text(FINISHED)).to_be_visible(timeout=300_000)
    expect_idle(page)
    text = page.evaluate(TOKENS_JS)
    for _ in range(30):
        page.wait_for_timeout(1000)
        again = page.evaluate(TOKENS_JS)
        if again == text and text:
            return text
        text = again
    return text


def test_a_room_of_browsers_watches_one_run_and_sees_the_same_text(tiny_model_dir):
    from playwright.sync_api import expect, sync_playwright

    SHOTS.mkdir(exist_ok=True)
    service_port, app_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if k != "SPECVIZ_DEFAULT_MODEL"}
    service = f"http://127.0.0.1:{service_port}"
    with process([sys.executable, "-m", "specviz", "serve", "--model", str(tiny_model_dir), "--port", str(service_port),
                  "--threads", "1"], "service-watch.log", env) as backend:
        wait_for(service + "/healthz", backend, "specviz serve", timeout_s=120)
        with streamlit(app_port, "server-watch.log", {**env, "SPECVIZ_BACKEND": service}) as app, sync_playwright() as pw:
            wait_for(f"http://127.0.0.1:{app_port}/_stcore/health", app, "streamlit")
            browser, page = open_browser(pw)
            try:
                page.goto(f"http://127.0.0.1:{app_port}/live")
                expect(sidebar(page).get_by_text(f"on the service at {service}")).to_be_visible(timeout=120_000)
                page.get_by_role("slider", name="Temperature").first.press("End")  # varied text, not a greedy loop
                expect_idle(page)
                main(page).get_by_text("Share with viewers").click()
                expect_idle(page)
                main(page).get_by_role("button", name="Run", exact=True).click()
                text = shown_text(page)
                link = re.search(r"https?://\S+\?watch=watch-[A-Za-z0-9_-]+",
                                 main(page).get_by_text("Viewers open").inner_text()).group(0)
                assert text and runs_done(service) == 1

                room = browser.new_context(viewport={"width": 1000, "height": 900})  # one cache for the room's pages
                viewers, seen = [], []
                for start in range(0, VIEWERS, BATCH):
                    batch = [room.new_page() for _ in range(min(BATCH, VIEWERS - start))]
                    for viewer in batch:  # each page's session starts its script as soon as it has loaded
                        viewer.goto(link, wait_until="commit")
                    for viewer in batch:
                        try:
                            seen.append(shown_text(viewer))
                            expect(viewer.get_by_text("Watching a shared run")).to_be_visible()
                        except Exception:
                            viewer.screenshot(path=str(SHOTS / f"watch-viewer-{len(viewers)}-failed.png"), full_page=True)
                            raise
                        viewers.append(viewer)
                viewers[-1].screenshot(path=str(SHOTS / "watch-viewer.png"), full_page=True)
                assert len(viewers) == VIEWERS and seen == [text] * VIEWERS  # all still open, all the same text
                assert runs_done(service) == 1  # one decode, however many watched
                assert not viewers[0].get_by_role("button", name="Run", exact=True).count()  # read-only
            finally:
                browser.close()
