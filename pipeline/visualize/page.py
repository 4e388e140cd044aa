"""One self-contained HTML page: the offload graph of every build of a model.

:func:`page_data` gathers what the page shows (the graph of each build from
its manifest, and the optional profile and numerics); :func:`render` puts it,
the page's CSS and JS and the vendored dagre layout library into
``template.html``. The result needs no network: every script and style is
inline, the data sits in a ``<script type="application/json">`` block, and no
``http://`` or ``https://`` appears anywhere (a URL inside the data, say in a
source line, is written with JSON's ``\\/`` escape).

Output is deterministic: the same inputs give the same bytes.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

from .graph import COLOURS, KIND_NAMES, KINDS, build_graph

HERE = Path(__file__).resolve().parent
DATA_FILES = ("template.html", "page.css", "page.js", "vendor/*")  # inlined into the page (code_deps.py)
DAGRE_VERSION = "3.1.3"

#: Files the page is made of (besides this package's Python): the stage
#: record lists them as code, so editing one re-runs ``visualize``.
ASSETS = ("template.html", "page.css", "page.js", "vendor/dagre.min.js", "vendor/LICENSE")

_SOURCE_MAP = re.compile(r"^//# sourceMappingURL=.*$", re.MULTILINE)
_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")


def page_data(model: str, manifests: dict[str, dict], profile: dict | None = None,
              numerics: dict | None = None, estimate: dict | None = None,
              fidelity: list[str] | None = None, search: dict | None = None) -> dict:
    """Everything the page shows, as plain JSON data.

    ``manifests``: variant -> parsed ``manifest.json`` (page order: as given);
    ``profile`` / ``numerics`` / ``estimate``: the output of
    :func:`~pipeline.visualize.readers.read_profile` / ``read_numerics`` /
    ``read_estimate``, or None; ``fidelity``: the held-out lines
    (:func:`pipeline.data.fidelity.holdout_lines`: what was measured, then the numbers), or None;
    ``search``: :func:`~pipeline.visualize.readers.read_search`'s result, or None.
    """
    return {
        "model": model,
        "order": list(manifests),
        "builds": {v: build_graph(m) for v, m in manifests.items()},
        "colours": COLOURS,
        "kinds": KIND_NAMES,
        "kind_order": list(KINDS),
        "profile": profile,
        "numerics": numerics,
        "estimate": estimate,
        "fidelity": fidelity or [],
        "search": search,
    }


def _asset(name: str) -> str:
    return (HERE / name).read_text(encoding="utf-8")


def _script(text: str, name: str) -> str:
    """Text safe inside ``<script>``: no closing tag, no comment opener, no source map line."""
    text = _SOURCE_MAP.sub("", text).rstrip() + "\n"
    if re.search(r"</script|<!--", text, re.IGNORECASE):
        raise ValueError(f"{name}: contains '</script' or '<!--', cannot be inlined")
    return text


def _json(data) -> str:
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    # "<" as \u003c: no "</script>" or "<!--" inside the block; "://" as ":\/\/": no URL literal
    return text.replace("<", "\\u003c").replace("://", ":\\/\\/")


def render(data: dict, links: dict[str, str] | None = None) -> str:
    """The HTML page of :func:`page_data`'s result; ``links``: text -> relative URL of
    pages shown next to the title (e.g. a detection model's ``detections/index.html``)."""
    licence = _asset("vendor/LICENSE").strip()
    if "--" in licence:
        raise ValueError("vendor/LICENSE contains '--', cannot sit in an HTML comment")
    parts = {
        "title": html.escape(f"{data['model']}: offload graph"),
        "model": html.escape(data["model"]),
        "css": _asset("page.css"),
        "dagre_licence": f"@dagrejs/dagre {DAGRE_VERSION} (bundles @dagrejs/graphlib), MIT licence:\n{licence}",
        "dagre": _script(_asset("vendor/dagre.min.js"), "vendor/dagre.min.js"),
        "js": _script(_asset("page.js"), "page.js"),
        "data": _json(data),
        "links": "".join(f' <a class="sub" href="{html.escape(url)}">{html.escape(text)}</a>'
                         for text, url in (links or {}).items()),
    }
    return _PLACEHOLDER.sub(lambda m: parts[m.group(1)], _asset("template.html"))


def offload_page(model: str, manifests: dict[str, dict], profile: dict | None = None,
                 numerics: dict | None = None, links: dict[str, str] | None = None,
                 estimate: dict | None = None, fidelity: list[str] | None = None,
                 search: dict | None = None) -> str:
    """The page's HTML for a model: :func:`render` of :func:`page_data` (``links``: see :func:`render`)."""
    return render(page_data(model, manifests, profile, numerics, estimate, fidelity, search), links)
