"""Headless Chromium over the DevTools protocol: what a person would see on the viewer's pages.

Used by the browser test (tests/test_view_browser.py), the load benchmark (bench/view/bench.py)
and `python -m harness.view RUN --screenshots DIR`. Chromium is Debian's package (`apt-get
install chromium`, /usr/bin/chromium); it is driven over its own DevTools websocket with aiohttp
(a project dependency), so nothing downloads a browser. Chromium's `--dump-dom` cannot wait for
the page's own requests, and playwright would want its own browser build: the protocol is five
commands here (create a target, navigate, evaluate, set the viewport, capture a screenshot).

    async with Browser() as browser:
        page = await browser.new_page()
        await page.goto(url, ready="document.querySelector('main').dataset.state === 'ready'")
        text = await page.eval("document.body.innerText")
        png = await page.screenshot()

Every wait has a deadline and says what it waited for when it runs out.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["Browser", "BrowserError", "Page", "chromium_path", "screenshot_views"]

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--hide-scrollbars", "--mute-audio",
         "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0"]
READY = "document.querySelector('main') && document.querySelector('main').dataset.state"


class BrowserError(RuntimeError):
    pass


def chromium_path() -> str | None:
    """The Chromium binary: $CHROMIUM, else chromium / chromium-browser on PATH."""
    if os.environ.get("CHROMIUM"):
        return os.environ["CHROMIUM"]
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Browser:
    def __init__(self, executable: str | None = None, *, start_timeout_s: float = 60.0):
        self.executable = executable or chromium_path()
        if self.executable is None:
            raise BrowserError("no Chromium found: install Debian's package (apt-get install -y "
                               "chromium) or set CHROMIUM=/path/to/chromium")
        self.start_timeout_s = start_timeout_s
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        self._events: dict[str, list[dict[str, Any]]] = {}
        self.proc: subprocess.Popen | None = None

    async def __aenter__(self) -> Browser:
        import aiohttp

        self._profile = tempfile.mkdtemp(prefix="harness-chromium-")
        self._log = open(Path(self._profile) / "chromium.log", "wb")  # noqa: SIM115 (closed in exit)
        self.proc = subprocess.Popen(
            [self.executable, *FLAGS, f"--user-data-dir={self._profile}", "about:blank"],
            stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        port_file = Path(self._profile) / "DevToolsActivePort"
        deadline = time.monotonic() + self.start_timeout_s
        while not (port_file.exists() and len(port_file.read_text().splitlines()) >= 2):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                log = (Path(self._profile) / "chromium.log").read_text(errors="replace")[-2000:]
                await self._stop()
                raise BrowserError(f"Chromium did not open its DevTools port within "
                                   f"{self.start_timeout_s:.0f} s (exit {self.proc.returncode}); "
                                   f"its output:\n{log}")
            await asyncio.sleep(0.05)
        port, path = port_file.read_text().splitlines()[:2]
        self._http = aiohttp.ClientSession()
        self._ws = await self._http.ws_connect(f"ws://127.0.0.1:{port}{path}", max_msg_size=0)
        self._reader = asyncio.create_task(self._read())
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stop()

    async def _stop(self) -> None:
        if getattr(self, "_reader", None) is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        if getattr(self, "_ws", None) is not None:
            await self._ws.close()
        if getattr(self, "_http", None) is not None:
            await self._http.close()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                await asyncio.to_thread(self.proc.wait, 10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                await asyncio.to_thread(self.proc.wait)
        self._log.close()
        shutil.rmtree(self._profile, ignore_errors=True)

    async def _read(self) -> None:
        async for msg in self._ws:
            data = json.loads(msg.data)
            future = self._pending.pop(data.get("id"), None)
            if future is not None and not future.done():
                if "error" in data:
                    future.set_exception(BrowserError(f"DevTools error: {data['error']}"))
                else:
                    future.set_result(data.get("result", {}))
            elif "method" in data:
                self._events.setdefault(data["method"], []).append(data)
        for future in self._pending.values():
            if not future.done():
                future.set_exception(BrowserError("Chromium closed its DevTools connection"))

    async def send(self, method: str, params: dict | None = None, session: str | None = None,
                   timeout_s: float = 60.0) -> dict[str, Any]:
        msg_id = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        self._pending[msg_id] = future
        body: dict[str, Any] = {"id": msg_id, "method": method, "params": params or {}}
        if session is not None:
            body["sessionId"] = session
        await self._ws.send_str(json.dumps(body))
        try:
            return await asyncio.wait_for(future, timeout_s)
        except TimeoutError as exc:
            raise BrowserError(f"Chromium did not answer {method} within {timeout_s:.0f} s") from exc

    async def new_page(self, width: int = 1400, height: int = 1000) -> Page:
        target = await self.send("Target.createTarget", {"url": "about:blank"})
        attached = await self.send("Target.attachToTarget",
                                   {"targetId": target["targetId"], "flatten": True})
        page = Page(self, attached["sessionId"])
        await page.send("Page.enable")
        await page.send("Runtime.enable")
        await page.viewport(width, height)
        return page


class Page:
    def __init__(self, browser: Browser, session: str):
        self.browser = browser
        self.session = session
        self.width, self.height = 1400, 1000

    async def send(self, method: str, params: dict | None = None) -> dict[str, Any]:
        return await self.browser.send(method, params, session=self.session)

    async def viewport(self, width: int, height: int) -> None:
        self.width, self.height = width, height
        await self.send("Emulation.setDeviceMetricsOverride",
                        {"width": width, "height": height, "deviceScaleFactor": 1,
                         "mobile": False})

    async def eval(self, expression: str) -> Any:
        result = await self.send("Runtime.evaluate", {"expression": expression,
                                                      "returnByValue": True,
                                                      "awaitPromise": True})
        if "exceptionDetails" in result:
            raise BrowserError(f"page script failed: {expression[:120]}: "
                               f"{result['exceptionDetails'].get('text')} "
                               f"{result['exceptionDetails'].get('exception', {})}")
        return result.get("result", {}).get("value")

    async def wait_for(self, expression: str, *, what: str, timeout_s: float = 30.0) -> Any:
        """Poll `expression` until truthy; BrowserError naming `what` when the deadline passes."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = await self.eval(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                state = await self.eval(f"({READY}) + ' | ' + document.body.innerText.slice(0, 300)")
                raise BrowserError(f"waited {timeout_s:.0f} s for {what}; the page shows: {state}")
            await asyncio.sleep(0.05)

    async def goto(self, url: str, *, timeout_s: float = 30.0) -> float:
        """Open `url` and wait until the viewer says its view is ready; returns the seconds."""
        # A hash change is a same-document navigation: mark the old view first so the wait
        # below cannot see the previous view's "ready".
        await self.eval(f"({READY}) ? (document.querySelector('main').dataset.state = "
                        "'navigating') : null")
        t0 = time.perf_counter()
        await self.send("Page.navigate", {"url": url})
        state = await self.wait_for(f"({READY}) === 'ready' || ({READY}) === 'error'"
                                    f" ? ({READY}) : false",
                                    what=f"the viewer page {url} to finish loading",
                                    timeout_s=timeout_s)
        if state == "error":
            text = await self.eval("document.querySelector('main').innerText")
            raise BrowserError(f"the viewer page {url} shows an error: {text}")
        return time.perf_counter() - t0

    async def screenshot(self, path: Path | None = None, *, full_page: bool = True,
                         max_height: int = 12000) -> bytes:
        """A PNG of the page (the whole page, up to `max_height` pixels, when `full_page`)."""
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            size = await self.eval("[document.documentElement.scrollWidth, "
                                   "document.documentElement.scrollHeight]")
            params.update(captureBeyondViewport=True,
                          clip={"x": 0, "y": 0, "width": max(size[0], self.width),
                                "height": min(max(size[1], self.height), max_height),
                                "scale": 1})
        png = base64.b64decode((await self.send("Page.captureScreenshot", params))["data"])
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(png)
        return png


VIEWS = (("run", "#/run"), ("rollouts", "#/rollouts"))


def screenshot_views(url: str, out_dir: Path, run: Any, *, compare: bool = False,
                     rollout: int | None = None, max_height: int = 2400) -> list[Path]:
    """One PNG per view of the viewer at `url`: the run, the rollouts, one rollout (a trained one
    with the most turns unless given), and before/after when the viewer compares two runs; each
    cut at `max_height` pixels (a long rollout's page runs to tens of thousands)."""
    rows = run.rollouts()
    if rollout is None and rows:
        rollout = _richest(run, rows)
    views = list(VIEWS)
    if rollout is not None:
        views.append(("rollout", f"#/rollout/{rollout}"))
    if compare:
        views.append(("compare", "#/compare"))

    async def shoot() -> list[Path]:
        paths = []
        async with Browser() as browser:
            page = await browser.new_page()
            for name, fragment in views:
                await page.goto(url + fragment)
                await asyncio.sleep(0.3)  # let uPlot finish its first paint (requestAnimationFrame)
                path = Path(out_dir) / f"view-{name}.png"
                await page.screenshot(path, max_height=max_height)
                paths.append(path)
        return paths

    return asyncio.run(shoot())


def _richest(run: Any, rows: list[dict[str, Any]]) -> int:
    """A trained rollout with a reply, preferring the most engine turns (cheap: first 50 ok)."""
    best, best_key = rows[0]["index"], (-1, -1)
    for row in rows[:50]:
        try:
            r = run.rollout(row["index"])
        except (KeyError, FileNotFoundError):
            continue
        key = (int(r.get("trained") is not None and r["trained"].get("advantage") is not None),
               len(r["turns"]))
        if key > best_key:
            best, best_key = row["index"], key
    return best
