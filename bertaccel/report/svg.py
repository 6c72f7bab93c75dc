"""A matplotlib figure as inline SVG whose marks show a tooltip on hover: each mark drawn with a gid
gets an SVG <title> (the browser's own tooltip), so the report's one HTML file stays interactive
with no JavaScript and no network, and each chart costs tens of kilobytes, not a plotting
library's megabytes. The markdown report keeps the PNG of the same figure.
"""
from __future__ import annotations

import io
import xml.etree.ElementTree as ET
from typing import Dict, Tuple

SVG_NS = "http://www.w3.org/2000/svg"
XLINK_NS = "http://www.w3.org/1999/xlink"
MARK_CLASS = "mark"  # every element with a tooltip carries it (the page's CSS and its tests find them)


def mark_id(stem: str, k: int) -> str:
    """The gid of mark k of a figure: unique in the page, since several figures share it."""
    return f"{stem}-mark-{k}"


def hoverable_inside(mark) -> None:
    """A hollow marker (fill: none) takes the pointer only on its outline, a pixel wide: its shapes,
    the closed paths and the <use> of a marker's path, take it anywhere inside (pointer-events all).
    An open path, a curve's line, keeps the default: the area its points enclose is not the mark."""
    for el in mark.iter():
        tag = el.tag.rsplit("}", 1)[-1]
        if tag == "use" or (tag == "path" and el.get("d", "").rstrip().endswith(("z", "Z"))):
            el.set("pointer-events", "all")


def svg_text(fig, tips: Dict[str, str], salt: str) -> str:
    """The figure as an <svg> element (no XML prologue), each element whose id is a key of tips
    given that text as its <title>. salt: matplotlib's svg.hashsalt, so the ids of two figures'
    clip paths and markers never collide in one page."""
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context({"svg.hashsalt": salt, "svg.fonttype": "none"}):
        fig.savefig(buf, format="svg")
    ET.register_namespace("", SVG_NS)
    ET.register_namespace("xlink", XLINK_NS)
    root = ET.fromstring(buf.getvalue())
    for el in root.iter():
        text = tips.get(el.get("id", ""))
        if text is not None:
            title = ET.Element(f"{{{SVG_NS}}}title")
            title.text = text
            el.insert(0, title)
            el.set("class", MARK_CLASS)
            hoverable_inside(el)
    # Scales to the page's width, keeping its aspect (matplotlib writes a fixed size in pt).
    root.set("width", "100%")
    root.attrib.pop("height", None)
    width_pt = float(root.get("viewBox", "0 0 480 320").split()[2])
    root.set("style", f"max-width:{width_pt * 4 / 3:.0f}px")  # 1 pt = 4/3 CSS px
    return ET.tostring(root, encoding="unicode")


def png_and_svg(fig, tips: Dict[str, str], salt: str) -> Tuple[bytes, str]:
    """(PNG bytes for the markdown, inline SVG with tooltips for the HTML), and the figure closed."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    svg = svg_text(fig, tips, salt)
    plt.close(fig)
    return buf.getvalue(), svg
