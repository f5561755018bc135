"""The live status page in a real browser: headless Chromium driven by
selenium loads /-/status from the metrics listener of a real master, finds
the tree (master, generation, workers, thread groups, threads), and follows
a reload through the page's own script: generation 2 appears and generation
1 leaves without the page being loaded again. The screenshot it takes goes
to the test's tmp dir, and to master/status-page.png (the README shows it)
when SOCKHERD_UPDATE_SCREENSHOT=1 (a test run leaves the tree as it was).

Chromium and chromedriver are Debian's (`chromium`, `chromium-driver`,
installed by `make test`); without them the browser test is skipped and
says so. The embedded default app's page (the same tree, asked of the
master over the control channel) is checked over plain HTTP.

The master and its workers are reaped by the `master` fixture; the browser
(chromedriver and every Chromium process under it) by `browser`. Every
wait polls with a deadline (WebDriverWait or wait_for)."""
from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import signal
import time
from pathlib import Path

import pytest

from test_reload import answers, free_port, get, write_app
from test_run import children, master, wait_for  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOT = ROOT / "master" / "status-page.png"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


def descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/task/{p}/children") as f:
                kids = [int(k) for k in f.read().split()]
        except OSError:
            continue
        out += kids
        todo += kids
    return out


@pytest.fixture
def browser():
    if not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)):
        pytest.skip("headless Chromium is not installed: the Debian packages chromium and "
                    "chromium-driver are needed (`make test` installs them when apt can)")
    webdriver = pytest.importorskip("selenium.webdriver",
                                    reason="selenium is not installed (pip install -e '.[test]')")
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1200,900", "--hide-scrollbars"):
        opts.add_argument(arg)
    # the driver named: selenium-manager never looks for one on the network
    service = Service(CHROMEDRIVER)
    driver = webdriver.Chrome(options=opts, service=service)
    try:
        driver.set_page_load_timeout(30)
        driver.set_script_timeout(10)
        yield driver
    finally:
        proc = service.process
        kids = descendants(proc.pid) if proc is not None else []
        try:
            driver.quit()
        finally:
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
            for pid in kids:                     # a Chromium left behind by a failed quit
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


# What the page shows, read in one script run: the page's own script swaps
# the tree in between two WebDriver calls, so elements are never kept.
READ_TREE = """
const m = document.querySelector("li.master");
return {
  master: m ? m.dataset.pid : null,
  masterText: m ? m.querySelector(".head").textContent : "",
  live: document.getElementById("live").textContent,
  workers: Array.from(document.querySelectorAll("li.worker")).map(w => ({
    generation: w.closest("li.generation").dataset.generation,
    worker: w.dataset.worker, pid: w.dataset.pid, role: w.dataset.role,
    groups: Array.from(w.querySelectorAll("li.group")).map(g => g.dataset.tgid),
    threads: Array.from(w.querySelectorAll("tr.thread")).map(t => t.dataset.tid),
    counters: Array.from(w.querySelectorAll("thead th")).map(t => t.textContent),
    requests: Number((w.querySelector(".requests") || {}).textContent || 0),
  })),
};
"""


def until(driver, what: str, check, timeout: float = 20):
    """check(tree read from the page)'s first true value, within timeout."""
    seen = []

    def probe():
        seen[:] = [driver.execute_script(READ_TREE)]
        return check(seen[0])
    return wait_for(probe, timeout, lambda: f"{what}; the page shows {seen and seen[0]}")


def in_generation(tree: dict, gen: int) -> list[dict]:
    return [w for w in tree["workers"] if w["generation"] == str(gen)]


def test_the_status_page_follows_a_reload_without_being_reloaded(master, tmp_path, browser):
    write_app(tmp_path, "v1")
    mport = free_port()
    m = master("verapp:app", "-w", "2", "--threads", "4", "--thread-groups", "2",
               "--metrics", f"127.0.0.1:{mport}")
    for _ in range(10):
        get(m.port)
    t0 = time.monotonic()
    browser.get(f"http://127.0.0.1:{mport}/-/status")
    assert browser.title == "sockherd status"

    # the tree: the master, generation 1 with both workers, each with its two
    # thread groups of two threads and their counters
    tree = until(browser, "generation 1's two workers",
                 lambda t: len(in_generation(t, 1)) == 2 and t)
    assert tree["master"] == str(m.proc.pid)
    assert f"master pid {m.proc.pid}" in tree["masterText"]
    assert "generation 1 serving" in tree["masterText"]
    assert {w["pid"] for w in tree["workers"]} == {str(p) for p in children(m.proc.pid)}
    for w in tree["workers"]:
        assert w["role"] == "serving" and w["groups"] == ["1", "2"]
        assert len(w["threads"]) == 4
        assert "accepted" in w["counters"] and "poll_io" in w["counters"]

    # the script took over: the page is refreshed in place, and new
    # requests show up in the workers' counters
    until(browser, "the script's first refresh", lambda t: t["live"].startswith("live: updated"))
    browser.execute_script("window.sockherdMarker = 'the first load'")
    shown = sum(w["requests"] for w in until(browser, "counters", lambda t: t)["workers"])
    for _ in range(15):
        get(m.port)
    until(browser, "15 more requests counted",
          lambda t: sum(w["requests"] for w in t["workers"]) >= shown + 15)

    # a reload with a changed app: generation 2 appears, generation 1 drains away
    write_app(tmp_path, "v2")
    m.proc.send_signal(signal.SIGHUP)
    until(browser, "generation 2's two workers", lambda t: len(in_generation(t, 2)) == 2,
          timeout=30)
    tree = until(browser, "generation 1 gone from the page",
                 lambda t: not in_generation(t, 1) and t, timeout=30)
    assert "generation 2 serving" in tree["masterText"]
    assert all(w["role"] == "serving" and len(w["threads"]) == 4 for w in tree["workers"])
    assert {w["pid"] for w in tree["workers"]} == {str(p) for p in children(m.proc.pid)}
    # ... all of it without the page being loaded again
    assert browser.execute_script("return window.sockherdMarker") == "the first load"
    assert browser.execute_script(
        "return performance.getEntriesByType('navigation').length") == 1
    m.wait_log(r"reload: generation 2 serving")
    answers(m.port, "v2")
    for _ in range(20):
        get(m.port)
    until(browser, "generation 2's requests counted",
          lambda t: sum(w["requests"] for w in t["workers"]) >= 20)
    print(f"browser test: page load to generation 2 alone took {time.monotonic() - t0:.1f}s")

    # the picture for the README: the whole page, at its height
    height = browser.execute_script("return document.documentElement.scrollHeight")
    browser.set_window_size(1200, min(max(height + 40, 400), 2400))
    until(browser, "a refresh at the new size", lambda t: t["live"].startswith("live: updated"))
    shot = tmp_path / "status-page.png"
    assert browser.save_screenshot(str(shot))
    if os.environ.get("SOCKHERD_UPDATE_SCREENSHOT") == "1":
        shutil.copyfile(shot, SCREENSHOT)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_embedded_apps_page_shows_the_masters_tree(master, tmp_path):
    """Bare `sockherd run`: the page any worker answers is the master's whole
    tree, asked over the control channel (found by the worker where the
    master put it: the fixture's SOCKHERD_RUNTIME_DIR, passed on to the
    workers with the rest of the master's environment)."""
    m = master("-w", "2", "--threads", "2")                       # no app: the embedded one
    m.wait_log(r"control: ipc://")
    pids = {str(p) for p in children(m.proc.pid)}

    def fetch(path: str) -> tuple[int, str, str]:
        c = http.client.HTTPConnection("127.0.0.1", m.port, timeout=15)
        try:
            c.request("GET", path)
            r = c.getresponse()
            return r.status, r.getheader("Content-Type", ""), r.read().decode()
        finally:
            c.close()

    status, ctype, body = fetch("/")
    assert status == 200 and ctype.startswith("text/html")
    assert "not available" not in body, body
    assert f"master pid {m.proc.pid}" in body
    assert set(re.findall(r'<li class="worker" data-worker="1\.[01]" data-pid="(\d+)"', body)) \
        == pids
    assert len(re.findall(r'<tr class="thread" data-tid="\d+"', body)) == 4    # 2 x 2
    assert re.search(r"answered by worker 1\.[01], pid (\d+)", body).group(1) in pids
    assert 'data-json="/-/status.json"' in body and "<noscript>" in body

    status, ctype, body = fetch("/-/status.json")
    assert status == 200 and ctype == "application/json"
    doc = json.loads(body)
    assert doc["tree"]["master"]["pid"] == m.proc.pid
    assert {str(w["pid"]) for w in doc["tree"]["workers"]} == pids
    assert all(len(w["threads"]) == 2 and w["stats"]["requests"] >= 0
               for w in doc["tree"]["workers"])
    assert fetch("/favicon.ico")[0] == 404
    # asking the master left nothing behind that holds a worker's exit
    m.proc.send_signal(signal.SIGTERM)
    assert m.proc.wait(timeout=30) == 0
    m.wait_log(r"worker 1\.\d: exited with status 0 \(drained\)", count=2)
