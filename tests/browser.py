"""A headless Debian chromium without a network, driven by selenium.

The driver path is explicit (``/usr/bin/chromedriver``) so Selenium Manager
never runs (it would try to download a driver); ``SeleniumManager`` is also
made to fail loudly should selenium call it anyway. Host names resolve to
nothing (``--host-resolver-rules``), and the performance log records every
request the page makes, so a test can check that none left ``file://``.

``python tests/browser.py page.html shot.png [width height]`` saves a
screenshot of any page (used to look at MobileNetV2's).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
INSTALL = "bash scripts/setup.sh --tests (apt-get install chromium chromium-driver; pip install selenium)"


def missing() -> str | None:
    """Why no browser test can run here, or None."""
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        return f"chromium / chromedriver not installed: run {INSTALL}"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return f"selenium not installed: run {INSTALL}"
    return None


def _no_selenium_manager(*args, **kwargs):
    raise AssertionError("Selenium Manager was called: it must not download anything")


def chromium(width: int = 1400, height: int = 900):
    """A headless chromium WebDriver, network off, browser and performance logs on."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common import selenium_manager

    selenium_manager.SeleniumManager.binary_paths = _no_selenium_manager
    opts = webdriver.ChromeOptions()
    opts.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                f"--window-size={width},{height}", "--host-resolver-rules=MAP * ~NOTFOUND",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-default-apps", "--no-first-run", "--disable-extensions",
                "--disable-features=Translate,OptimizationHints,MediaRouter", "--hide-scrollbars"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    return webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=opts)


def requests(driver) -> list[str]:
    """URLs the page requested so far (from the performance log; reading it empties it)."""
    out = []
    for entry in driver.get_log("performance"):
        msg = json.loads(entry["message"])["message"]
        if msg.get("method") == "Network.requestWillBeSent":
            out.append(msg["params"]["request"]["url"])
    return out


def screenshot(html: Path, png: Path, width: int = 1400, height: int = 900) -> Path:
    """Open ``html`` and save a screenshot of the viewport to ``png``."""
    driver = chromium(width, height)
    try:
        driver.get(html.resolve().as_uri())
        png.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(png))
    finally:
        driver.quit()
    return png


if __name__ == "__main__":
    if why := missing():
        sys.exit(why)
    size = [int(x) for x in sys.argv[3:5]] or [1400, 900]
    print(screenshot(Path(sys.argv[1]), Path(sys.argv[2]), *size))
