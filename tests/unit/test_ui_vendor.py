"""The operations page's chart library, vendored from npm (infra/vendor_ui.sh): the files in
static/vendor/ are the version that ui/web/package.json and its lock pin, the provider's
wheel carries them, and the page loads them from its own folder (no CDN)."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path, PurePosixPath

import streamkeeper_airflow.ui

UI = Path(streamkeeper_airflow.ui.__file__).parent
WEB = UI / "web"
VENDOR = UI / "static" / "vendor"
PROVIDER = Path(__file__).resolve().parents[2] / "provider" / "pyproject.toml"
SHIPPED = ("uPlot.iife.min.js", "uPlot.min.css", "uPlot.LICENSE")


def _pinned() -> str:
    version = json.loads((WEB / "package.json").read_text())["dependencies"]["uplot"]
    assert re.fullmatch(r"\d+\.\d+\.\d+", version), f"uplot {version!r}: pin an exact version"
    return version


def test_the_vendored_files_are_the_version_package_json_pins() -> None:
    version = _pinned()
    lock = json.loads((WEB / "package-lock.json").read_text())
    assert lock["packages"][""]["dependencies"]["uplot"] == version
    assert lock["packages"]["node_modules/uplot"]["version"] == version
    banner = f"/*! https://github.com/leeoniya/uPlot (v{version}) */"
    for name in ("uPlot.iife.min.js", "uPlot.min.css"):
        first_line = (VENDOR / name).read_text().split("\n", 1)[0]
        assert first_line == banner, f"{name} is {first_line!r}; run infra/vendor_ui.sh"
    license_text = (VENDOR / "uPlot.LICENSE").read_text()
    assert "The MIT License" in license_text and "Leon Sorokin" in license_text


def test_the_page_loads_the_library_from_its_own_folder() -> None:
    html = (UI / "static" / "index.html").read_text()
    sources = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert "static/vendor/uPlot.iife.min.js" in sources
    assert "static/vendor/uPlot.min.css" in sources
    assert sources.index("static/vendor/uPlot.iife.min.js") < sources.index("static/page.js")
    assert not [s for s in sources if "//" in s], sources  # nothing from another origin


def test_the_providers_wheel_carries_the_vendored_files() -> None:
    patterns = tomllib.loads(PROVIDER.read_text())["tool"]["setuptools"]["package-data"]
    for name in SHIPPED:
        path = PurePosixPath("ui/static/vendor", name)
        matched = [
            p
            for p in patterns["streamkeeper_airflow"]
            if len(PurePosixPath(p).parts) == len(path.parts) and path.match(p)
        ]
        assert matched, f"no package-data pattern of {PROVIDER} ships {path}"
