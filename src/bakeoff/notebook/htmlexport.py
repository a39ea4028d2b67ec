"""Executed notebooks to self-contained HTML: code hidden, no fetch from the network when opened.

Every report (campaign, trend) goes through :func:`export_html`, with the ``offline``
template from :func:`bakeoff.paths.templates_dir`, and is written atomically.
"""

from __future__ import annotations

from pathlib import Path

from bakeoff.paths import templates_dir
from bakeoff.results.store import atomic_write_bytes


def export_html(executed: Path, html: Path) -> Path:
    """Write ``executed`` (an executed notebook) as HTML to ``html``, inputs and prompts left out."""
    from nbconvert import HTMLExporter  # deferred: the report extra, heavy to import
    from nbformat import read

    exporter = HTMLExporter(
        exclude_input=True,
        exclude_input_prompt=True,
        exclude_output_prompt=True,
        extra_template_basedirs=[str(templates_dir())],
        template_name="offline",
    )
    with open(executed) as handle:
        body, _ = exporter.from_notebook_node(read(handle, as_version=4))
    atomic_write_bytes(html, body.encode())
    return html
