"""The rendered report as headless Chromium sees it, with the network cut off.

A script put first into the page's head records console errors, uncaught errors and every
resource fetched (a local file too: a report that links one is not self-contained); on
``load`` it writes what it saw, with the images, the headings and where each ``bakeoff-*``
element sits, into the DOM, which ``--dump-dom`` prints; :func:`screenshot` saves the first
screen at the same window size. Used by tests/test_report_browser.py (a reference-server
campaign) and tests/test_e2e_container.py (a real-engine campaign).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import prerequisites

CHECK = """<script>
window.__seen = {errors: []};
const original = console.error;
console.error = (...args) => { window.__seen.errors.push(args.join(' ')); original(...args); };
window.addEventListener('error', e => window.__seen.errors.push('uncaught: ' + (e.message || e.target.src)), true);
window.addEventListener('load', () => {
  const images = Array.from(document.images);
  // Chromium keeps no resource timing for file: URLs: what the page's elements load is read from them too.
  const timed = performance.getEntriesByType('resource').map(r => r.name);
  const loaders = 'img[src], script[src], iframe[src], frame[src], embed[src], source[src], video[src], audio[src], '
    + 'track[src], input[src], link[href], object[data]';
  const linked = Array.from(document.querySelectorAll(loaders)).map(e => e.src || e.href || e.data).filter(Boolean);
  const result = {
    errors: window.__seen.errors,
    images: images.length,
    undecoded: images.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src.slice(0, 60)),
    fetched: Array.from(new Set([...timed, ...linked])).filter(n => !/^(data|blob):/.test(n)),
    headings: Array.from(document.querySelectorAll('h1, h2, h3')).map(h => h.textContent.trim()),
    // Where the first screen's parts sit in the window (CSS px from the top of the page), and the window.
    viewport: {width: window.innerWidth, height: window.innerHeight},
    boxes: Object.fromEntries(Array.from(document.querySelectorAll('[id^="bakeoff-"]')).map(e => {
      const r = e.getBoundingClientRect();
      return [e.id, {top: r.top + window.scrollY, bottom: r.bottom + window.scrollY, width: r.width,
                     text: e.textContent.slice(0, 2000)}];
    })),
  };
  const out = document.createElement('pre');
  out.id = 'bakeoff-check';
  out.textContent = JSON.stringify(result);
  document.body.appendChild(out);
});
</script>"""


# The window a reader on a laptop opens the report in: what shows without scrolling is "above the fold".
WINDOW = (1400, 900)


def _chromium(tmp_path: Path) -> list[str]:
    return [
        prerequisites.chromium(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--host-resolver-rules=MAP * ~NOTFOUND",  # a request to the network would fail, and show
        f"--window-size={WINDOW[0]},{WINDOW[1]}",
        "--hide-scrollbars",
        "--virtual-time-budget=10000",
    ]


def open_in_chromium(html: Path, tmp_path: Path) -> dict[str, object]:
    page = tmp_path / "checked.html"
    text = html.read_text()
    page.write_text(re.sub(r"<head>", "<head>" + CHECK, text, count=1))
    argv = [*_chromium(tmp_path), "--dump-dom", page.as_uri()]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    found = re.search(r'<pre id="bakeoff-check">(.*?)</pre>', done.stdout, flags=re.S)
    assert found, f"no check result from Chromium: {done.stderr[-2000:]}"
    result: dict[str, object] = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    return result


def screenshot(html: Path, png: Path, tmp_path: Path) -> Path:
    """The first screen of ``html`` as a reader sees it in a :data:`WINDOW` window, saved to ``png``."""
    argv = [*_chromium(tmp_path), f"--screenshot={png}", html.as_uri()]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert png.is_file() and png.stat().st_size > 0, f"no screenshot from Chromium: {done.stderr[-2000:]}"
    return png
