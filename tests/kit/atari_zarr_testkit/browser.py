"""A real headless Chromium on loopback, driven through the DevTools protocol (test kit).

For tests of what a notebook shows (the episode player): open a page, evaluate
JavaScript in it, take a screenshot. It uses Debian's ``chromium`` (``apt-get install
chromium``), started with ``--remote-debugging-port`` on 127.0.0.1 and a profile of
its own; the protocol is spoken over aiohttp's WebSocket client. Nothing is
downloaded.

Examples
--------
>>> import shutil
>>> if shutil.which("chromium"):
...     with HeadlessChromium() as browser:
...         page = browser.open("data:text/html,<p id=x>hi</p>")
...         print(page.evaluate("document.getElementById('x').textContent"))
... else:
...     print("hi")
hi
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import shutil
import tempfile
import time
import urllib.parse
from typing import Any, ClassVar

from atari_zarr_testkit.process import LoopbackServer

__all__ = ["HeadlessChromium", "Page", "find_chromium"]

_BINARIES = ("chromium", "chromium-browser", "google-chrome")


def find_chromium() -> str | None:
    """The Chromium executable on PATH (Debian's ``chromium`` first), or None."""
    for name in _BINARIES:
        found = shutil.which(name)
        if found:
            return found
    return None


class Page:
    """One tab: JavaScript evaluated in it, screenshots of it (each call one connection)."""

    def __init__(self, ws_url: str, timeout: float) -> None:
        self.ws_url = ws_url
        self.timeout = timeout
        self._ids = itertools.count(1)

    def _call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return self._calls([(method, params or {})])

    def _calls(self, calls: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
        """Send ``calls`` in turn on one connection (one DevTools session, whose overrides
        last as long as it does); the result of the last."""

        async def go() -> dict[str, Any]:
            import aiohttp

            result: dict[str, Any] = {}
            async with aiohttp.ClientSession() as session:
                async with session.ws_connect(self.ws_url, max_msg_size=0) as ws:
                    for method, params in calls:
                        message_id = next(self._ids)
                        await ws.send_json({"id": message_id, "method": method, "params": params})
                        async for msg in ws:
                            data = json.loads(msg.data)
                            if data.get("id") == message_id:
                                if "error" in data:
                                    raise RuntimeError(f"{method}: {data['error']}")
                                result = dict(data.get("result", {}))
                                break
                        else:
                            raise RuntimeError(f"{method}: the browser closed the connection")
            return result

        return asyncio.run(asyncio.wait_for(go(), self.timeout))

    def evaluate(self, expression: str, *, width: int | None = None, height: int = 900) -> Any:
        """The value of ``expression`` in the page (promises awaited); with ``width``, as
        laid out in a viewport of ``width`` x ``height`` CSS pixels (a phone's is 390
        wide: the page's media queries apply as on one)."""
        evaluate = (
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
        )
        viewport = {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}
        result = self._calls(
            [evaluate]
            if width is None
            else [("Emulation.setDeviceMetricsOverride", viewport), evaluate]
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression!r} raised: {result['exceptionDetails']}")
        return result.get("result", {}).get("value")

    def wait_for(self, expression: str, timeout: float = 30.0) -> Any:
        """Evaluate ``expression`` until it is truthy (its value), or raise after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"{expression!r} stayed falsy for {timeout} s")
            time.sleep(0.05)

    def screenshot(self, *, width: int | None = None, height: int = 900) -> bytes:
        """A PNG of the page as it is drawn now; with ``width``, laid out ``width`` x
        ``height`` CSS pixels wide (as :meth:`evaluate` does)."""
        shot = ("Page.captureScreenshot", {"format": "png"})
        viewport = {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}
        calls = (
            [shot] if width is None else [("Emulation.setDeviceMetricsOverride", viewport), shot]
        )
        return base64.b64decode(self._calls(calls)["data"])


class HeadlessChromium(LoopbackServer):
    """Headless Chromium with its DevTools endpoint on 127.0.0.1.

    Parameters
    ----------
    binary : str, optional
        The executable (default: :func:`find_chromium`).
    timeout : float
        Seconds each protocol call may take.
    """

    label: ClassVar[str] = "chromium"
    log_prefix: ClassVar[str] = "chromium-log-"
    ready_path: ClassVar[str] = "/json/version"

    def __init__(self, binary: str | None = None, *, timeout: float = 60.0) -> None:
        super().__init__(startup_timeout=60.0)
        self.binary = binary or find_chromium()
        self.timeout = float(timeout)
        self._profile: tempfile.TemporaryDirectory[str] | None = None

    def _prepare_start(self) -> None:
        if not self.binary:
            raise RuntimeError(
                "no Chromium on PATH: install Debian's package (apt-get install chromium)"
            )

    def _workdir(self) -> str | None:
        self._profile = tempfile.TemporaryDirectory(prefix="chromium-profile-")
        return self._profile.name

    def _command(self) -> list[str]:
        assert self.binary and self._profile is not None
        return [
            self.binary,
            "--headless=new",
            "--no-sandbox",  # CI containers run as root
            "--disable-gpu",
            "--no-first-run",
            "--no-default-browser-check",
            "--allow-file-access-from-files",
            f"--user-data-dir={self._profile.name}",
            f"--remote-debugging-address={self.host}",
            f"--remote-debugging-port={self.port}",
            "--window-size=900,900",
            "about:blank",
        ]

    def _release(self) -> None:
        if self._profile is not None:
            with contextlib.suppress(OSError):
                self._profile.cleanup()
            self._profile = None

    def open(self, url: str) -> Page:
        """A new tab showing ``url``, once it has loaded."""
        status, body = self._http(
            "PUT", "/json/new?" + urllib.parse.quote(url, safe=""), timeout=self.timeout
        )
        if status != 200:
            raise RuntimeError(f"chromium could not open {url[:80]}: HTTP {status} {body[:200]!r}")
        page = Page(json.loads(body)["webSocketDebuggerUrl"], self.timeout)
        # a new tab is the blank page first, complete already: wait for ``url`` itself
        page.wait_for(
            "location.href !== 'about:blank' && document.readyState === 'complete'",
            timeout=self.timeout,
        )
        return page
