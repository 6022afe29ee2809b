"""Headless Chromium for browser tests: Debian's chromium driven by its chromedriver.

The flags keep Chromium off the network it would otherwise call at start (this
machine's network is closed: background requests fail, many at a time); each browser
gets a fresh profile folder.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = (
    "--headless",
    "--no-sandbox",  # tests run as root
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,1000",
)


def missing() -> str | None:
    """Why no browser can start here (None: it can)."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if shutil.which(path) is None:
            return f"{path} missing: apt-get install chromium chromium-driver (infra/setup.sh)"
    return None


def start_chromium(profile: Path, log: Path) -> Any:
    """A Selenium WebDriver on a new headless Chromium with its own profile folder."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    service = Service(executable_path=CHROMEDRIVER, log_output=str(log))
    return webdriver.Chrome(options=options, service=service)
