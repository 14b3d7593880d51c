"""The HTML report in a real browser: headless Chromium driven by selenium, with the network off.

The test opens a report from disk (file://), clicks a thumbnail, hovers a cell of the map it opened
and reads the weight the page shows, which must be the array's (the weights are made here with
NumPy, the reference); it sorts the statistics and uses the head view; it fails on any console
error (browser log entries at level SEVERE) and on any request other than the file itself (and
the data: URLs of its thumbnails), read from the DevTools performance log (``Network.*`` events)
and from ``performance.getEntriesByType('resource')``. A screenshot is kept under the test's
tmp_path (its path is printed).

Chromium is Debian's ``chromium`` and ``chromium-driver`` (``/usr/bin/chromium``,
``/usr/bin/chromedriver``). Without them or without selenium the tests skip, unless
``ATTNVIZ_REQUIRE_BROWSER=1`` (set by .ci/run when it installed them): then they fail.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from tests.test_html import invoke, softmax

REQUIRED = os.environ.get("ATTNVIZ_REQUIRE_BROWSER") == "1"
NOWHERE = "http://127.0.0.1:9"  # the discard port: every request through this proxy fails


def _find(*names: str) -> str | None:
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    return None


def _missing() -> list[str]:
    missing = []
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("selenium is not installed (pip install selenium)")
    if _find("chromium", "chromium-browser") is None:
        missing.append("no chromium (apt-get install chromium)")
    if _find("chromedriver") is None:
        missing.append("no chromedriver (apt-get install chromium-driver)")
    return missing


def start_chromium(tmp_path_factory, *flags: str, logs: bool = False):
    """Headless Chromium driven by chromedriver (skipped without them, failed when ATTNVIZ_REQUIRE_BROWSER=1), with
    a profile of its own and ``flags`` besides; ``logs``: the browser's console and network logs kept."""
    missing = _missing()
    if missing:
        if REQUIRED:
            pytest.fail("ATTNVIZ_REQUIRE_BROWSER=1, but " + "; ".join(missing))
        pytest.skip("; ".join(missing))
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = _find("chromium", "chromium-browser")
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-extensions", "--no-first-run",
                 f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}", *flags):
        options.add_argument(flag)
    if logs:
        options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=Service(_find("chromedriver")), options=options)
    driver.set_page_load_timeout(60)
    return driver


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    driver = start_chromium(tmp_path_factory, "--disable-default-apps", "--disable-domain-reliability",
                            "--no-default-browser-check", "--window-size=1400,1100", f"--proxy-server={NOWHERE}",
                            "--proxy-bypass-list=<-loopback>", logs=True)
    driver.execute_cdp_cmd("Network.enable", {})
    driver.execute_cdp_cmd("Network.emulateNetworkConditions", {
        "offline": True, "latency": 0, "downloadThroughput": 0, "uploadThroughput": 0})
    yield driver
    driver.quit()


def open_page(driver, path: Path) -> None:
    driver.get_log("browser")  # drop what an earlier page logged
    driver.get_log("performance")
    driver.get(path.as_uri())
    deadline = time.monotonic() + 30
    while driver.execute_script("return document.body && document.body.dataset.ready") != "true":
        if time.monotonic() > deadline:
            raise AssertionError(f"the page did not finish drawing; console: {driver.get_log('browser')}")
        time.sleep(0.05)


def requests_made(driver, page: Path) -> list[str]:
    """Every URL the page asked for, other than itself and data: URLs (DevTools events and the
    resource timing entries)."""
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] in ("Network.requestWillBeSent", "Network.webSocketCreated",
                                 "Network.eventSourceMessageReceived"):
            params = message["params"]
            urls.append(params.get("request", {}).get("url") or params.get("url", "?"))
    urls += driver.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    return [u for u in urls if u != page.as_uri() and not u.startswith("data:")]


def console_errors(driver) -> list[dict]:
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def hover_cell(driver, i: int, j: int) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    canvas = driver.find_element(By.ID, "map")
    left, top, cell = (float(canvas.get_attribute(f"data-{k}")) for k in ("left", "top", "cell"))
    rect = canvas.rect
    # selenium's offsets are from the element's centre
    x = left + (j + 0.5) * cell - rect["width"] / 2
    y = top + (i + 0.5) * cell - rect["height"] / 2
    ActionChains(driver).move_to_element_with_offset(canvas, round(x), round(y)).perform()


def shown_number(text: str) -> float:
    return float(text.strip())


def close(shown: str, value: float) -> bool:
    """The page shows four significant digits: within half a unit of the last one."""
    if value == 0:
        return shown_number(shown) == 0
    unit = 10 ** (math.floor(math.log10(abs(value))) - 3)
    return abs(shown_number(shown) - value) <= unit / 2 + 1e-7 * abs(value)


LABELS_Q = ["[CLS]", "</script><img src=x onerror=alert(1)>", "the", "cat", "sat", "on", "<b>mat</b>"]
LABELS_K = ["k0", "k1", "k&amp;2", "k3", "k4"]


def test_report_in_chromium_click_hover_sort_head_view(browser, tmp_path):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    rng = np.random.default_rng(7)
    w = softmax(rng.normal(size=(3, 1, 4, len(LABELS_Q), len(LABELS_K))) * 2).astype(np.float32)
    np.save(tmp_path / "w.npy", w)
    (tmp_path / "q.json").write_text(json.dumps(LABELS_Q))
    (tmp_path / "k.json").write_text(json.dumps(LABELS_K))
    page = tmp_path / "report.html"
    r = invoke("inspect", tmp_path / "w.npy", "--q-labels", tmp_path / "q.json", "--k-labels", tmp_path / "k.json",
               "--html", page, "--quiet")
    assert r.exit_code == 0, r.output

    open_page(browser, page)
    assert browser.title.startswith("attention weights of")
    assert len(browser.find_elements(By.CSS_SELECTOR, ".thumb canvas")) == 12
    assert not browser.find_elements(By.TAG_NAME, "img")  # no image, none from a label

    # click the thumbnail of layer 2, head 1: the map it opens is that head's
    browser.find_element(By.CSS_SELECTOR, '.thumb[aria-label="layer 2, head 1"]').click()
    assert browser.find_element(By.ID, "detail-title").text == "layer 2, head 1"
    for i, j in ((4, 3), (1, 0), (6, 4)):
        hover_cell(browser, i, j)
        query = browser.find_element(By.ID, "readout-query")
        key = browser.find_element(By.ID, "readout-key")
        assert query.find_element(By.CLASS_NAME, "pos").text == str(i)
        assert query.find_element(By.CLASS_NAME, "tok").get_attribute("textContent") == LABELS_Q[i]
        assert key.find_element(By.CLASS_NAME, "pos").text == str(j)
        assert key.find_element(By.CLASS_NAME, "tok").get_attribute("textContent") == LABELS_K[j]
        weight = browser.find_element(By.ID, "readout-weight").text
        assert close(weight, float(w[2, 0, 1, i, j])), (i, j, weight, w[2, 0, 1, i, j])
        assert browser.find_element(By.ID, "tooltip").is_displayed()
    # the cell read is that head's, not a neighbour's or another head's
    others = [w[2, 0, 1, 6, 3], w[2, 0, 1, 5, 4], w[2, 0, 0, 6, 4], w[1, 0, 1, 6, 4]]
    assert not any(close(weight, float(v)) for v in others)

    # sort the head statistics by H: largest first, then reversed
    header = browser.find_element(By.XPATH, "//table[@id='stats-table']//th[.//span[text()='H']]")
    header.find_element(By.TAG_NAME, "button").click()
    column = [c["name"] for c in json.loads(browser.execute_script(
        "return JSON.stringify(JSON.parse(document.getElementById('attnviz-data').textContent).stats.columns)"))]
    h = column.index("H")

    def column_values() -> list[float]:
        rows = browser.find_elements(By.CSS_SELECTOR, "#stats-table tbody tr")
        return [float(row.find_elements(By.TAG_NAME, "td")[h].text) for row in rows]

    entropy = -(w.astype(np.float64) * np.log(w)).sum(axis=-1).mean(axis=(1, 3))  # [layers, heads], NumPy
    assert column_values() == pytest.approx(sorted(entropy.ravel(), reverse=True), abs=5e-4)
    assert header.get_attribute("aria-sort") == "descending"
    header.find_element(By.TAG_NAME, "button").click()
    assert column_values() == pytest.approx(sorted(entropy.ravel()), abs=5e-4)
    # a row opens its map
    browser.find_elements(By.CSS_SELECTOR, "#stats-table tbody tr")[0].click()
    li, hi = np.unravel_index(int(np.argmin(entropy)), entropy.shape)
    assert browser.find_element(By.ID, "detail-title").text == f"layer {li}, head {hi}"

    # the head view: hover the query token 3 ("cat"): its strongest key is NumPy's argmax
    tokens = browser.find_elements(By.CSS_SELECTOR, ".hv-left .hv-token")
    assert [t.get_attribute("textContent") for t in tokens] == LABELS_Q
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", tokens[3])
    ActionChains(browser).move_to_element(tokens[3]).perform()
    info = browser.find_element(By.ID, "hv-info").text
    best = int(np.argmax(w[li, 0, hi, 3]))
    assert "query 3 cat; largest" in info and f"on key {best} {LABELS_K[best]}" in info
    shown = info.split("largest ")[1].split(" ")[0]
    assert close(shown, float(w[li, 0, hi, 3, best]))
    select = browser.find_element(By.ID, "head-select")
    assert select.get_attribute("value") == str(li * 4 + hi)

    browser.execute_script("window.scrollTo(0, 0)")
    hover_cell(browser, 2, 2)
    shot = tmp_path / "report.png"
    assert browser.save_screenshot(str(shot))
    assert shot.stat().st_size > 10_000
    print(f"screenshot: {shot}")

    assert console_errors(browser) == []
    assert requests_made(browser, page) == []


def test_a_compute_command_report_in_chromium(browser, tmp_path):
    from selenium.webdriver.common.by import By

    rng = np.random.default_rng(3)
    q, k, v = (rng.normal(size=(2, 3, 9, 4)).astype(np.float32) for _ in range(3))
    np.savez(tmp_path / "qkv.npz", q=q, k=k, v=v)
    page = tmp_path / "scaled.html"
    r = invoke("scaled", tmp_path / "qkv.npz", "--html", page, "--quiet")
    assert r.exit_code == 0, r.output
    expected = softmax(q.astype(np.float64) @ np.swapaxes(k, -1, -2) / 2.0)  # 1 / sqrt(d_k), d_k = 4
    open_page(browser, page)
    browser.find_element(By.CSS_SELECTOR, '.thumb[aria-label="slice [1, 2]"]').click()
    hover_cell(browser, 8, 5)
    assert close(browser.find_element(By.ID, "readout-weight").text, float(expected[1, 2, 8, 5]))
    assert console_errors(browser) == []
    assert requests_made(browser, page) == []


def test_the_checks_catch_a_request_and_a_console_error(browser, tmp_path):
    # the detectors themselves: a page that asks for an image over the network and throws
    page = tmp_path / "bad.html"
    page.write_text("<!DOCTYPE html><html><body><img src='http://example.invalid/x.png'>"
                    "<script>document.body.dataset.ready = 'true'; throw new Error('boom');</script></body></html>")
    open_page(browser, page)
    time.sleep(0.5)
    assert any("boom" in e["message"] for e in console_errors(browser))
    assert any("example.invalid" in u for u in requests_made(browser, page))


def test_two_inline_python_reports_draw_in_their_own_frames(browser, tmp_path):
    """``_repr_html_`` of two results in one notebook page: each report draws in its own frame, offline."""
    import attnviz

    rng = np.random.default_rng(0)
    q, k, v = (rng.normal(size=(2, 4, 6, 8)).astype("float32") for _ in range(3))
    computed = attnviz.scaled(q, k, v, causal=True, labels=["[CLS]", "the", "play", "##ers", "won", "[SEP]"])
    inspected = attnviz.inspect(computed.weights)
    page = tmp_path / "notebook.html"
    page.write_text("<html><body><div>cell 1</div>" + computed._repr_html_() + "<div>cell 2</div>"
                    + inspected._repr_html_() + "</body></html>")
    browser.get_log("performance")
    browser.get(page.as_uri())
    headings = []
    for index in range(2):
        browser.switch_to.default_content()
        browser.switch_to.frame(index)
        deadline = time.monotonic() + 30
        while browser.execute_script("return document.body && document.body.dataset.ready") != "true":
            if time.monotonic() > deadline:
                raise AssertionError(f"frame {index} did not finish drawing; console: {browser.get_log('browser')}")
            time.sleep(0.05)
        headings.append(browser.execute_script("return document.querySelector('h1').textContent"))
    browser.switch_to.default_content()
    assert headings[0].startswith("scaled attention weights [2, 4, 6, 6]")
    assert headings[1].startswith("attention weights of the array [2, 4, 6, 6] given")
    assert requests_made(browser, page) == []


def test_the_image_panel_shows_a_hovered_patch_s_attention(browser, tmp_path):
    """inspect --html with --image: hovering a patch shows its row over the patches (its strongest patch
    is the one the NumPy weights make hot, in the colour table's top colour), hovering the CLS token shows
    the CLS row; the picture travels inside the page (a data: URI, no request)."""
    from PIL import Image
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    rng = np.random.default_rng(11)
    w = softmax(rng.normal(size=(1, 1, 2, 17, 17))).astype(np.float64)  # CLS + a 4 x 4 grid of patches
    target = rng.permutation(16)  # patch k attends to patch target[k]
    for k in range(16):
        w[0, 0, :, 1 + k, 1 + target[k]] += 20
    w[0, 0, :, 0, 1 + 5] += 20  # CLS attends to patch 5
    w /= w.sum(-1, keepdims=True)
    np.save(tmp_path / "vit.npy", w.astype(np.float32))
    Image.fromarray(rng.integers(0, 256, size=(32, 32, 3), dtype=np.uint8)).save(tmp_path / "pic.png")
    page = tmp_path / "image.html"
    r = invoke("inspect", tmp_path / "vit.npy", "--image", tmp_path / "pic.png", "--patch-grid", "4x4", "--labels",
               ",".join(["[CLS]"] + [f"p{k}" for k in range(16)]), "--html", page, "--quiet")
    assert r.exit_code == 0, r.output
    open_page(browser, page)
    deadline = time.monotonic() + 30
    while browser.execute_script("return document.body.dataset.imageReady") != "true":
        assert time.monotonic() < deadline, browser.get_log("browser")
        time.sleep(0.05)
    best = browser.find_element(By.ID, "image-best")
    assert best.get_attribute("data-patch") == "5"  # the --query default: CLS
    marks = browser.find_element(By.ID, "image-mark")
    cell_w, cell_h = (float(browser.find_element(By.ID, "image-map").get_attribute(f"data-cell{a}")) for a in "wh")
    top = browser.execute_script(
        "const t = atob(JSON.parse(document.getElementById('attnviz-data').textContent).scale.lut);"
        "return [t.charCodeAt(t.length - 3), t.charCodeAt(t.length - 2), t.charCodeAt(t.length - 1)];")
    for i, j in ((2, 1), (0, 3)):
        k = i * 4 + j
        ActionChains(browser).move_to_element_with_offset(
            marks, round((j + 0.5) * cell_w - marks.rect["width"] / 2),
            round((i + 0.5) * cell_h - marks.rect["height"] / 2)).perform()
        assert f"patch ({i}, {j}), position {1 + k}" in browser.find_element(By.ID, "image-query").text
        hot = int(target[k])
        shown = browser.find_element(By.ID, "image-best")
        assert shown.get_attribute("data-patch") == str(hot)
        assert close(shown.text.split("weight ")[1], float(w[0, 0, :, 1 + k, 1 + hot].mean()))
        pixel = browser.execute_script(
            "return Array.from(document.getElementById('image-map').getContext('2d')"
            ".getImageData(arguments[0], arguments[1], 1, 1).data)",
            round((hot % 4 + 0.5) * cell_w), round((hot // 4 + 0.5) * cell_h))
        assert pixel[:3] == top and pixel[3] == 255
    token = browser.find_element(By.CSS_SELECTOR, '.image-token[data-pos="0"]')
    assert token.get_attribute("textContent") == "[CLS]"
    ActionChains(browser).move_to_element(token).perform()
    assert browser.find_element(By.ID, "image-best").get_attribute("data-patch") == "5"
    assert console_errors(browser) == []
    assert requests_made(browser, page) == []
