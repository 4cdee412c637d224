"""A class decoding on vLLM at once: `vllm serve` with our EAGLE-3 head as a chain of depth 3 (test_vllm's server),
the app pointed at it with SPECVIZ_BACKEND=vllm+http://..., and 16 Chromium pages of Live decoding that press Run
together. vLLM batches the 16 runs; every page finishes with the same greedy text. Each page's first-token time
(from its click to its first committed token on the page, both stamped in the page) is printed and saved to
screenshots/vllm-16-first-token.txt."""
import os
import statistics
import time

import pytest
from test_browser import SHOTS, expect_idle, free_port, main, open_browser, pytestmark, sidebar, streamlit, wait_for  # noqa: F401
from test_browser_watch import shown_text
from test_vllm import export, launched, served, vllm_python  # noqa: F401

PAGES = 16
BATCH = 4  # pages loaded at once: sixteen Streamlit pages loading together starve a 2-core machine
MAX_NEW = 24  # the sidebar's slider starts at 32; each ArrowLeft takes one off
# In every page: the wall-clock time (ms) of the click on Run, and of the first committed token in the DOM after it.
STAMPS_JS = """
window.__firstToken = {click: null, first: null};
document.addEventListener('click', event => {
  const button = event.target.closest && event.target.closest('button');
  if (!button || button.innerText.trim() !== 'Run' || window.__firstToken.click !== null) return;
  window.__firstToken.click = performance.timeOrigin + performance.now();
  new MutationObserver((_, observer) => {
    if (document.querySelector('.specviz-token')) {
      window.__firstToken.first = performance.timeOrigin + performance.now();
      observer.disconnect();
    }
  }).observe(document.body, {childList: true, subtree: true});
}, true);
"""

CLICK_IN_S = 2.0  # time to arm every page's timer (an idle page answers in milliseconds)
CLICK_AT_JS = """at => {
  const run = [...document.querySelectorAll('[data-testid="stMainBlockContainer"] button')]
    .find(button => button.innerText.trim() === 'Run');
  if (run) setTimeout(() => run.click(), at - Date.now());
  return Boolean(run);
}"""


def open_live(page, vllm_url: str) -> None:
    """/live on the vLLM backend, with a short budget at T = 0, idle and ready to run."""
    from playwright.sync_api import expect

    expect(sidebar(page).get_by_text(f"on vLLM at {vllm_url} (speculative")).to_be_visible(timeout=180_000)
    expect_idle(page)
    budget = sidebar(page).get_by_role("slider", name="Max new tokens").first
    for _ in range(32 - MAX_NEW):
        budget.press("ArrowLeft")
    expect(budget).to_have_value(str(MAX_NEW))
    expect_idle(page)
    expect(main(page).get_by_text(f"drafter vllm, temperature 0.0, K 4, max {MAX_NEW} new tokens").first).to_be_visible()
    expect(main(page).get_by_role("button", name="Run", exact=True)).to_be_enabled()


def failed(page, index: int) -> None:
    page.screenshot(path=str(SHOTS / f"vllm-page-{index}-failed.png"), full_page=True)


@pytest.mark.slow
def test_sixteen_browsers_run_at_once_on_vllm_and_all_finish(served):  # noqa: F811
    from playwright.sync_api import sync_playwright

    SHOTS.mkdir(exist_ok=True)
    app_port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "SPECVIZ_DEFAULT_MODEL"}
    with streamlit(app_port, "server-vllm.log", {**env, "SPECVIZ_BACKEND": "vllm+" + served.url}) as app, \
            sync_playwright() as pw:
        url = f"http://127.0.0.1:{app_port}"
        wait_for(url + "/_stcore/health", app, "streamlit")
        browser, _ = open_browser(pw)
        try:
            room = browser.new_context(viewport={"width": 1000, "height": 900})  # one cache for the room's pages
            room.add_init_script(STAMPS_JS)
            pages = []
            for start in range(0, PAGES, BATCH):
                batch = [room.new_page() for _ in range(min(BATCH, PAGES - start))]
                for page in batch:
                    page.goto(url + "/live", wait_until="commit")
                for page in batch:
                    try:
                        open_live(page, served.url)
                    except Exception:
                        failed(page, len(pages))
                        raise
                    pages.append(page)

            # one Playwright click a page took 1.7 s here once runs had started (it waits for the page to be
            # stable); a timer in every page clicks at the same wall-clock moment instead
            at = (time.time() + CLICK_IN_S) * 1000
            assert all(page.evaluate(CLICK_AT_JS, at) for page in pages), "a page has no Run button"

            texts = []
            for index, page in enumerate(pages):
                try:
                    texts.append(shown_text(page))
                except Exception:
                    failed(page, index)
                    raise
            stamps = [page.evaluate("() => window.__firstToken") for page in pages]
        finally:
            browser.close()

    first_s = [(s["first"] - s["click"]) / 1000 for s in stamps]
    clicks_s = (max(s["click"] for s in stamps) - min(s["click"] for s in stamps)) / 1000
    report = (f"{PAGES} pages on vLLM (EAGLE-3, depth 3), {MAX_NEW} new tokens at T = 0, clicks within {clicks_s:.2f} s: "
              f"first token min {min(first_s):.2f} s, median {statistics.median(first_s):.2f} s, max {max(first_s):.2f} s; "
              "each page: " + " ".join(f"{t:.2f}" for t in first_s))
    print("\n" + report)
    (SHOTS / "vllm-16-first-token.txt").write_text(report + "\n")
    assert clicks_s < 1, "the pages did not press Run together"
    assert texts[0] and texts == [texts[0]] * PAGES  # every page finished, and the same greedy text
