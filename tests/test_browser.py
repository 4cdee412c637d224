"""The app in a real browser: `streamlit run app.py` on a free port with the embedded SmolLM2 model, driven by
Playwright through Debian's Chromium. Saves a screenshot of every page to screenshots/ (printed)."""
import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from specviz import models

ROOT = Path(__file__).resolve().parent.parent
SHOTS = ROOT / "screenshots"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
PAGES = ["Start here", "Why it works", "Live decoding", "EAGLE tree explorer", "Rejection sampling lab",
         "Topologies compared", "Topology race",
         "Cost and scale", "Is it really lossless?", "Benchmarks"]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not os.path.exists(CHROMIUM),
                       reason="no Chromium: install the OS package (apt-get install -y chromium) to run the browser test"),
    pytest.mark.skipif(not models.is_fetched("smollm2-135m"), reason="the embedded model is not fetched (make fetch)"),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(url: str, proc, what: str, timeout_s: float = 60) -> None:
    deadline = time.time() + timeout_s
    while True:
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                pytest.fail(f"{what} did not start")
            time.sleep(0.5)


@contextlib.contextmanager
def process(command: list[str], log_name: str, env: dict):
    log = open(SHOTS / log_name, "w")  # read it when the test fails
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def streamlit(port: int, log_name: str, env: dict):
    return process([sys.executable, "-m", "streamlit", "run", "app.py", "--server.headless", "true", "--server.port",
                    str(port), "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false",
                    "--server.fileWatcherType", "none"], log_name, env)


@pytest.fixture(scope="module")
def server():
    SHOTS.mkdir(exist_ok=True)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("SPECVIZ_DEFAULT_MODEL", "SPECVIZ_BACKEND")}
    with streamlit(port, "server.log", env) as proc:
        url = f"http://127.0.0.1:{port}"
        wait_for(url + "/_stcore/health", proc, "streamlit")
        yield url


def test_the_guided_path_in_a_browser(server):
    """A new engineer's path: open the app on *Start here*, follow each step's link, do its "try this"."""
    from playwright.sync_api import expect, sync_playwright

    SHOTS.mkdir(exist_ok=True)
    print(f"\nscreenshots: {SHOTS}")
    with sync_playwright() as pw:
        browser, page = open_browser(pw)
        try:
            page.goto(server)
            expect(page.get_by_text("Drafter", exact=True)).to_be_visible(timeout=300_000)  # the model loaded (slow on a busy CPU)
            expect(page.get_by_role("heading", name="Start here")).to_be_visible()
            expect(main(page).get_by_text("Try this:")).to_have_count(8)
            # the first sidebar change of a fresh server's first browser session reaches the script (with the
            # pages in a folder named pages/ beside app.py, Streamlit drops it: the widgets change identity)
            expect_idle(page)
            pick_drafter(page, "ngram")
            expect(sidebar(page).get_by_text("prompt lookup: copy what followed")).to_be_visible()
            pick_drafter(page, "eagle2")
            expect(sidebar(page).get_by_text("EAGLE-2: a feature-level draft head")).to_be_visible()
            shot(page, "0-start-here")

            follow_guide(page, "Why it works")
            expect(page.get_by_role("heading", name="Why speculative decoding works")).to_be_visible()
            main(page).get_by_role("button", name="Measure this machine").click()
            expect(page.get_by_text("Share explained by weight streaming")).to_be_visible(timeout=120_000)
            shot(page, "1-overview")

            follow_guide(page, "Live decoding")
            # a long run, so that Stop lands mid-run however fast this machine decodes 32 tokens
            page.get_by_role("slider", name="Max new tokens").first.press("End")
            expect(page.get_by_role("slider", name="Max new tokens").first).to_have_value("256")
            expect_idle(page)
            main(page).get_by_role("button", name="Run", exact=True).click()
            expect(page.locator(".specviz-token").first).to_be_visible(timeout=90_000)  # tokens stream in
            main(page).get_by_role("button", name="Stop", exact=True).click()  # stop mid-run: what was decoded stays
            expect(page.get_by_text("Stopped after")).to_be_visible()
            # what was decoded stays: the rerun after Stop may draw the notice before the tokens, so wait for them
            expect(page.locator(".specviz-token").first).to_be_visible()
            main(page).get_by_role("button", name="Run", exact=True).click()  # the stopped run released the model
            expect(page.get_by_text(re.compile(r"stopped: (eos|max_new_tokens)"))).to_be_visible(timeout=120_000)
            expect(page.get_by_role("button", name="Download this trace (JSONL)")).to_be_visible()
            assert page.locator(".specviz-token").count() > 3
            shot(page, "2-live")

            follow_guide(page, "EAGLE tree explorer")
            expect(page.get_by_text("tree attention mask").first).to_be_visible()
            expect(page.locator(".js-plotly-plot").first).to_be_visible()
            assert page.locator(".js-plotly-plot .scatterlayer .point").count() > 1  # the tree's nodes
            expect(page.get_by_role("heading", name="How this step was verified")).to_be_visible()
            shot(page, "3-tree")

            follow_guide(page, "Rejection sampling lab")
            expect(page.get_by_text("p: target's top tokens at this position").first).to_be_visible()
            main(page).get_by_role("tab", name="Check yourself").click()
            expect_idle(page)
            main(page).get_by_text("accepted", exact=True).first.click()  # answer question 1
            expect_idle(page)
            main(page).get_by_role("button", name="Check").first.click()
            expect(page.get_by_text(re.compile(r"^(Right|Not quite): you said"))).to_be_visible()
            expect(page.get_by_text(re.compile(r"^[01] right, 1 of \d+ answered$"))).to_be_visible()
            shot(page, "4-lab")

            follow_guide(page, "Topologies compared")
            expect(page.get_by_role("heading", name="What the acceptance numbers mean")).to_be_visible()
            expect(page.get_by_text("τ (tokens per target forward)")).to_be_visible()  # the live run's numbers
            shot(page, "5-topologies")

            follow_guide(page, "Topology race")
            expect(page.get_by_role("button", name=re.compile("Run the race|Start the race")).first).to_be_visible()
            shot(page, "6-race")

            follow_guide(page, "Cost and scale")
            expect(page.get_by_text("Cost per million output tokens")).to_be_visible()
            shot(page, "7-cost")

            follow_guide(page, "Is it really lossless?")
            expect(page.get_by_role("button", name="Sample 200 runs")).to_be_visible()
            shot(page, "8-lossless")

            nav(page, "Benchmarks")
            expect(page.get_by_role("button", name="Run the bench")).to_be_visible()
            shot(page, "9-benchmarks")
        finally:
            browser.close()


def follow_guide(page, title: str) -> None:
    """Back to *Start here*, then its link to the page."""
    nav(page, "Start here")
    main(page).get_by_role("link", name=f"Open {title}").click()
    expect_idle(page)


def open_browser(pw):
    """Debian's Chromium, headless, with the flags this closed network needs; a tall page, long timeouts."""
    from playwright.sync_api import expect

    browser = pw.chromium.launch(executable_path=CHROMIUM, args=[
        "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"])
    page = browser.new_page(viewport={"width": 1400, "height": 2200})
    page.set_default_timeout(60_000)
    expect.set_options(timeout=60_000)
    return browser, page


def sidebar(page):
    return page.get_by_test_id("stSidebar")


def pick_drafter(page, name: str) -> None:
    sidebar(page).get_by_role("combobox", name="Drafter").click()
    page.get_by_role("option", name=name, exact=True).click()
    expect_idle(page)


def main(page):
    """The page's own content (the header has a Stop button of its own while a script runs)."""
    return page.get_by_test_id("stMainBlockContainer")


def nav(page, title: str) -> None:
    page.locator('[data-testid="stSidebarNav"]').get_by_text(title, exact=True).click()
    expect_idle(page)


def expect_idle(page) -> None:
    """Wait until the script run finishes (Streamlit shows a status widget while it runs)."""
    page.wait_for_timeout(500)
    page.wait_for_function("!document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=120_000)


def shot(page, name: str) -> None:
    expect_idle(page)
    page.wait_for_timeout(700)  # plotly finishes drawing
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def test_the_app_in_a_browser_streams_from_a_specviz_serve_process():
    """The deployment of docs/service.md on one machine: `specviz serve` with the embedded model, and the app
    pointed at it with SPECVIZ_BACKEND; live decoding, the tree explorer and the race run on the service."""
    from playwright.sync_api import expect, sync_playwright

    SHOTS.mkdir(exist_ok=True)
    service_port, app_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if k != "SPECVIZ_DEFAULT_MODEL"}
    service = f"http://127.0.0.1:{service_port}"
    with process([sys.executable, "-m", "specviz", "serve", "--model", "smollm2-135m", "--port", str(service_port)],
                 "service.log", env) as backend:
        wait_for(service + "/healthz", backend, "specviz serve", timeout_s=300)  # it warms every drafter first
        with streamlit(app_port, "server-remote.log", {**env, "SPECVIZ_BACKEND": service}) as app, sync_playwright() as pw:
            wait_for(f"http://127.0.0.1:{app_port}/_stcore/health", app, "streamlit")
            browser, page = open_browser(pw)
            try:
                page.goto(f"http://127.0.0.1:{app_port}")
                expect(sidebar(page).get_by_text(f"on the service at {service}")).to_be_visible(timeout=120_000)
                nav(page, "Live decoding")
                main(page).get_by_role("button", name="Run", exact=True).click()
                expect(page.get_by_text(re.compile(r"stopped: (eos|max_new_tokens)"))).to_be_visible(timeout=180_000)
                assert page.locator(".specviz-token").count() > 3
                shot(page, "remote-1-live")
                nav(page, "EAGLE tree explorer")
                expect(page.locator(".js-plotly-plot").first).to_be_visible()
                assert page.locator(".js-plotly-plot .scatterlayer .point").count() > 1
                nav(page, "Topology race")
                page.get_by_role("spinbutton", name="Max new tokens").fill("4")
                page.keyboard.press("Enter")
                expect_idle(page)
                main(page).get_by_role("button", name="Run the race").click()
                expect(page.get_by_text("Speedup = tokens/s")).to_be_visible(timeout=300_000)
                shot(page, "remote-2-race")
            finally:
                browser.close()
