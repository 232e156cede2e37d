"""Headless Chromium driven over its DevTools protocol: open a page, wait for text, run a script,
take a screenshot (of the page, or of one element). Used by the browser tests of the dashboard
and of the report."""

from __future__ import annotations

import base64
import json
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

from test_dashboard_browser import CHROMIUM_FLAGS


class Browser:
    def __init__(self, chromium: str, profile: Path, size: tuple[int, int] = (1400, 1000)) -> None:
        self.size = size
        self._process = subprocess.Popen(
            [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--remote-debugging-port=0",
             f"--window-size={size[0]},{size[1]}", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            self._connect(profile)
        except BaseException:
            self.close()
            raise

    def _connect(self, profile: Path) -> None:
        import websocket

        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text().strip()):
            if time.monotonic() > deadline:
                raise AssertionError("Chromium did not open its DevTools port")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as answer:
            page = next(t for t in json.load(answer) if t["type"] == "page")
        self._ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=30)
        self._ids = iter(range(1, 1_000_000))
        width, height = self.size
        self.call(
            "Emulation.setDeviceMetricsOverride",
            width=width, height=height, deviceScaleFactor=1, mobile=False,
        )  # fmt: skip

    def call(self, method: str, **params: object) -> dict:
        ident = next(self._ids)
        self._ws.send(json.dumps({"id": ident, "method": method, "params": params}))
        while True:
            message = json.loads(self._ws.recv())
            if message.get("id") == ident:
                return message.get("result", {})

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result.get("result", {}).get("value")

    def open(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def wait_for_text(self, text: str, timeout_s: float = 40) -> None:
        deadline = time.monotonic() + timeout_s
        while text not in (self.evaluate("document.body ? document.body.innerText : ''") or ""):
            if time.monotonic() > deadline:
                raise AssertionError(f"{text!r} never appeared on the page")
            time.sleep(0.3)

    def on_first_screen(self, text: str) -> bool:
        """Is the innermost element showing this text drawn inside the first screen?"""
        return bool(
            self.evaluate(
                "(() => { const all = [...document.querySelectorAll('body *')].filter("
                f"e => e.innerText && e.innerText.includes({json.dumps(text)}));"
                "const e = all[all.length - 1]; if (!e) return false;"
                "const r = e.getBoundingClientRect();"
                "return r.height > 0 && r.top >= 0 && r.bottom <= window.innerHeight; })()"
            )
        )

    def screenshot(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(
            base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"])
        )

    def screenshot_of(self, element: str, path: Path, *, pad: int = 8) -> None:
        """A PNG of one element (`element`: a JavaScript expression for it), scrolled into view."""
        box = self.evaluate(
            f"(() => {{ const e = {element}; e.scrollIntoView(); const r = e.getBoundingClientRect();"
            "return [r.left + window.scrollX, r.top + window.scrollY, r.width, r.height]; })()"
        )
        x, y, width, height = box
        clip = {"x": max(0, x - pad), "y": max(0, y - pad), "width": width + 2 * pad,
                "height": height + 2 * pad, "scale": 1}  # fmt: skip
        path.parent.mkdir(parents=True, exist_ok=True)
        shot = self.call(
            "Page.captureScreenshot", format="png", clip=clip, captureBeyondViewport=True
        )
        path.write_bytes(base64.b64decode(shot["data"]))

    def close(self) -> None:
        ws = getattr(self, "_ws", None)
        if ws is not None:
            ws.close()
        self._process.terminate()
        self._process.wait(timeout=10)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
