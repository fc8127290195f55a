"""Screenshot of an attncli --html page as a projector shows it (1024x768), with the arithmetic of
one cell on display: python docs/page_screenshot.py PAGE.html OUT.png [QUERY KEY]

Needs playwright (pip) and a chromium on PATH (Debian: apt-get install chromium); it never
downloads a browser.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from playwright.sync_api import sync_playwright


def main(page_file: str, out: str, query: int = 1, key: int = 0) -> None:
    exe = next((p for n in ("chromium", "chromium-browser", "google-chrome") if (p := shutil.which(n))), None)
    if exe is None:
        sys.exit("no chromium on PATH")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=exe, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1024, "height": 768})
        page.goto(Path(page_file).resolve().as_uri())
        cell = page.locator(f"table[data-step=weights] td[data-q='{query}'][data-k='{key}']")
        cell.scroll_into_view_if_needed()
        cell.click()
        page.screenshot(path=out)
        browser.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], *(int(a) for a in sys.argv[3:5]))
