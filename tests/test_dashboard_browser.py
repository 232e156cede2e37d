"""`dashboard` in a real browser: headless Chromium renders a trial page with its VRAM attributes.

Also a script that makes the README's screenshot of a trial page (its user-attribute box scrolled
to the VRAM values, as a person would scroll it):

    python tests/test_dashboard_browser.py http://127.0.0.1:8080/dashboard/studies/1/trials?numbers=3 out.png
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.record.store.location import StorageLocation
from tests.waiting import patient

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "test-artifacts"
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
)


def find_chromium() -> str | None:
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


def require_chromium() -> str:
    path = find_chromium()
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail(
                "CI=true but no Chromium found: .ci/run installs it with `apt-get install -y chromium`"
            )
        pytest.skip(
            "no Chromium on this machine: `apt-get install -y chromium` to run the browser test"
        )
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, process: subprocess.Popen, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(
                f"dashboard exited with {process.returncode}: {process.stderr.read()}"
            )
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"dashboard did not listen on port {port} within {timeout_s}s")


def dump_dom(chromium: str, url: str, profile: Path) -> str:
    """The page as rendered after its scripts ran (virtual time lets the app fetch and draw)."""
    done = subprocess.run(
        [
            chromium,
            *CHROMIUM_FLAGS,
            f"--user-data-dir={profile}",
            "--virtual-time-budget=10000",
            "--dump-dom",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=90,
    )
    return done.stdout


def screenshot(
    chromium: str, url: str, out: Path, profile: Path, *, size: tuple[int, int] = (1400, 1000)
) -> None:
    """A PNG of the page; with websocket-client it waits for the VRAM attributes and scrolls to them."""
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        import websocket  # noqa: F401  (websocket-client)
    except ImportError:
        subprocess.run(
            [
                chromium,
                *CHROMIUM_FLAGS,
                f"--user-data-dir={profile}",
                "--virtual-time-budget=10000",
                f"--window-size={size[0]},{size[1]}",
                f"--screenshot={out}",
                url,
            ],
            capture_output=True,
            timeout=90,
        )
        return
    _screenshot_over_devtools(chromium, url, out, profile, size)


SCROLL_TO_VRAM = """
(() => {
  const boxes = [...document.querySelectorAll('div')].filter(
    d => d.scrollHeight > d.clientHeight && d.textContent.includes('vram_peak_mb') &&
         getComputedStyle(d).overflowY === 'auto' && d.clientHeight < 400);
  boxes.forEach(d => { d.scrollTop = d.scrollHeight; });
  return boxes.length;
})()
"""


def _screenshot_over_devtools(
    chromium: str, url: str, out: Path, profile: Path, size: tuple[int, int]
) -> None:
    import websocket

    browser = subprocess.Popen(
        [
            chromium,
            *CHROMIUM_FLAGS,
            f"--user-data-dir={profile}",
            "--remote-debugging-port=0",
            f"--window-size={size[0]},{size[1]}",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text().strip()):
            if time.monotonic() > deadline:
                raise AssertionError("Chromium did not open its DevTools port")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as answer:
            page = next(t for t in json.load(answer) if t["type"] == "page")
        ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=30)
        counter = iter(range(1, 1_000_000))

        def call(method: str, **params: object) -> dict:
            ident = next(counter)
            ws.send(json.dumps({"id": ident, "method": method, "params": params}))
            while True:
                message = json.loads(ws.recv())
                if message.get("id") == ident:
                    return message.get("result", {})

        call("Page.enable")
        call(
            "Emulation.setDeviceMetricsOverride",
            width=size[0],
            height=size[1],
            deviceScaleFactor=1,
            mobile=False,
        )
        call("Page.navigate", url=url)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            text = call(
                "Runtime.evaluate",
                expression="document.body ? document.body.innerText : ''",
                returnByValue=True,
            )
            if "vram_peak_mb" in text.get("result", {}).get("value", ""):
                break
            time.sleep(0.3)
        call("Runtime.evaluate", expression=SCROLL_TO_VRAM, returnByValue=True)
        time.sleep(0.5)
        shot = call("Page.captureScreenshot", format="png")
        out.write_bytes(base64.b64decode(shot["data"]))
        ws.close()
    finally:
        browser.terminate()
        browser.wait(timeout=patient(10))


@pytest.fixture
def dashboard(sqlite_url) -> Iterator[tuple[str, dict]]:
    """optuna-dashboard, started by our command, on a study with finished trials."""
    from test_status import build_study

    built = build_study(sqlite_url, "browser-demo", completed=4)
    # What `run` and `optimize` set when they create a study: the dashboard's name for the value.
    import optuna

    optuna.load_study(study_name="browser-demo", storage=built["storage"]).set_metric_names(
        ["loss"]
    )
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "orchestrator",
            "dashboard",
            "--storage",
            sqlite_url,
            "--port",
            str(port),
        ],
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_port(port, process)
        yield f"http://127.0.0.1:{port}", built
    finally:
        process.terminate()
        process.wait(timeout=patient(10))


@pytest.mark.browser
def test_a_trial_page_shows_the_study_and_its_vram_in_chromium(dashboard, tmp_path):
    chromium = require_chromium()
    base, built = dashboard
    best = built["best"]
    url = f"{base}/dashboard/studies/1/trials?numbers={best}"
    dom = dump_dom(chromium, url, tmp_path / "profile-dom")
    expected_peak = built["storage"].get_all_trials(1)[best].user_attrs["vram_peak_mb"]
    assert "browser-demo" in dom, dom[:2000]
    assert f"Trial {best}" in dom
    assert f"vram_peak_mb {expected_peak}" in dom
    assert "vram_planned_mb" in dom

    shot = ARTIFACTS / "dashboard-trial.png"
    shot.unlink(missing_ok=True)
    screenshot(chromium, url, shot, tmp_path / "profile-shot")
    assert shot.read_bytes().startswith(b"\x89PNG") and shot.stat().st_size > 10_000


@pytest.mark.browser
def test_the_dashboard_names_the_metric_in_chromium(dashboard, tmp_path):
    """A study with its metric names set (as `run` and `optimize` set them) is charted by its
    metric's name, where the dashboard would otherwise say "Objective 0"."""
    from cdp import Browser

    chromium = require_chromium()
    base, built = dashboard
    study_id = 1
    with Browser(chromium, tmp_path / "profile", size=(1400, 1000)) as browser:
        browser.open(f"{base}/dashboard/studies/{study_id}")
        browser.wait_for_text(f"Best Trial (number={built['best']})", timeout_s=120)  # data in
        text = browser.evaluate("document.body.innerText")
        browser.screenshot(ARTIFACTS / "dashboard-metric.png")
    assert "y Axis\nloss" in text or "y Axis\n\nloss" in text, text[:800]
    assert "Objective 0" not in text
    assert (ARTIFACTS / "dashboard-metric.png").stat().st_size > 10_000


def test_a_port_in_use_is_one_line(sqlite_url, capsys):
    from orchestrator.cli import main

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code = main(["dashboard", "--storage", sqlite_url, "--port", str(port)])
    err = capsys.readouterr().err
    assert code == 2 and f"port {port} on 127.0.0.1 is in use" in err and err.count("\n") == 1


def test_listening_beyond_localhost_says_it_is_the_users_choice(sqlite_url):
    from orchestrator.record.store.migrate import open_storage

    open_storage(StorageLocation.parse(sqlite_url))
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "orchestrator",
            "dashboard",
            "--storage",
            sqlite_url,
            "--host",
            "0.0.0.0",
            "--port",
            str(port),
        ],
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_port(port, process)
    finally:
        process.terminate()
        _, err = process.communicate(timeout=patient(10))
    assert "not localhost, as you chose with --host" in err


if __name__ == "__main__":
    found = find_chromium()
    if found is None or len(sys.argv) != 3:
        sys.exit(
            "usage: python tests/test_dashboard_browser.py URL OUT.png (needs chromium on PATH)"
        )
    with tempfile.TemporaryDirectory() as profile:
        screenshot(found, sys.argv[1], Path(sys.argv[2]), Path(profile))
    print(sys.argv[2])
