"""A matplotlib figure as inline SVG text (the static figures: the explain page, the drift report's SVGs)."""

from __future__ import annotations

import io


def svg_text(figure, svg_id: str) -> str:
    """The figure as an <svg> element with a stable id (no XML prolog: inline SVG in HTML)."""
    import warnings

    import matplotlib

    buffer = io.StringIO()
    with matplotlib.rc_context({"svg.id": svg_id, "svg.fonttype": "none", "svg.hashsalt": svg_id}), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)     # matplotlib's layout advice is not the user's business
        figure.savefig(buffer, format="svg", bbox_inches="tight")
    text = buffer.getvalue()
    return text[text.index("<svg"):]
