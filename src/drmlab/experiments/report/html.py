"""Building blocks of a self-contained HTML page: escaping, tables, the studies' markdown, embedded figures.

A page built from these needs nothing outside its one file: no script at all, no style sheet,
font or image from elsewhere. Figures are PNG bytes embedded as ``data:image/png;base64`` URLs, and
the page declares a Content-Security-Policy (``default-src 'none'; img-src data:; style-src
'unsafe-inline'``) so a browser refuses -- and reports -- any outside resource that a later change
might slip in. Every string that comes from a file goes through :func:`esc` (``html.escape`` with
quotes) before it reaches the page; the functions here take plain values and escape them
themselves, so callers never write raw text into markup.

:func:`markdown_html` renders the small part of markdown the study reports write
(:mod:`drmlab.experiments.ablate.report`, :mod:`drmlab.experiments.mqar.report`,
:mod:`drmlab.experiments.loop.report`): ``#`` headings, pipe tables with their alignment
row, ``*`` / ``-`` bullets, paragraphs, and inline code, bold and emphasis. The page therefore shows
the reports' own tables rather than a second rendering of the same numbers.
"""

from __future__ import annotations

import base64
import html
import io
import math
import re
from collections.abc import Callable, Iterable

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
CONTENT_SECURITY_POLICY = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"

STYLE = """
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto; max-width: 72em;
       padding: 0 1.5em; color: #222; background: #fff; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; }
h2 { font-size: 1.25em; margin-top: 2em; border-bottom: 1px solid #ddd; padding-bottom: 0.2em; }
h3 { font-size: 1.05em; margin-top: 1.4em; }
table { border-collapse: collapse; margin: 0.6em 0 1em; font-size: 0.92em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; vertical-align: top; }
th { background: #f3f3f3; text-align: left; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
code, td.mono { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; font-size: 0.9em; }
td.mono { word-break: break-all; }
figure { margin: 1em 0; }
figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { color: #555; font-size: 0.9em; }
.subtitle { color: #555; margin-top: 0; }
.note { color: #7a4a00; background: #fff6e5; padding: 0.4em 0.7em; border-left: 3px solid #e0a030; }
.yes { color: #0a6b2d; font-weight: 600; }
.no { color: #8a1c1c; }
details { margin: 0.5em 0; }
summary { cursor: pointer; color: #333; }
"""


def esc(value) -> str:
    """``value`` as text safe inside an element or a quoted attribute."""
    return html.escape(str(value), quote=True)


def fmt(value) -> str:
    """A value as short text: floats to 6 significant digits, integers with thousands separators,
    None as a dash, booleans as yes/no, lists joined by commas (not escaped: see :func:`cell`)."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{value:.6g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(fmt(v) for v in value)
    return str(value)


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def cell(value, tag: str = "td") -> str:
    """One table cell of ``value`` (escaped; numbers right-aligned, long hex strings monospaced)."""
    text = fmt(value)
    if is_number(value):
        return f'<{tag} class="num">{esc(text)}</{tag}>'
    if isinstance(value, str) and re.fullmatch(r"[0-9a-f]{32,}", value):
        return f'<{tag} class="mono">{esc(text)}</{tag}>'
    return f"<{tag}>{esc(text)}</{tag}>"


def table(header: Iterable, rows: Iterable[Iterable]) -> str:
    """A table with the ``header`` cells and the ``rows`` of values (every cell escaped)."""
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(cell(v) for v in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def flatten(values: dict, prefix: str = "") -> list[tuple[str, object]]:
    """``{"a": {"b": 1}}`` -> ``[("a.b", 1)]``; lists of dicts are numbered (``a.0.b``)."""
    out: list[tuple[str, object]] = []
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out += flatten(value, name + ".") if value else [(name, "{}")]
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            for i, item in enumerate(value):
                out += flatten(item, f"{name}.{i}.")
        else:
            out.append((name, value))
    return out


def key_value_table(values: dict, max_items: int | None = None) -> str:
    """Two columns, setting and value, of a (nested) dict; long lists are cut with a count."""
    rows = []
    for key, value in flatten(values):
        if isinstance(value, list) and max_items is not None and len(value) > max_items:
            value = fmt(value[:max_items]) + f", ... ({len(value):,} in all)"
        rows.append((key, value))
    return table(("setting", "value"), rows)


def section(title: str, *parts: str, level: int = 2) -> str:
    return f"<h{level}>{esc(title)}</h{level}>\n" + "\n".join(p for p in parts if p)


def paragraph(text: str, css: str | None = None) -> str:
    return f'<p class="{esc(css)}">{esc(text)}</p>' if css else f"<p>{esc(text)}</p>"


def details(summary: str, body: str) -> str:
    """A collapsed block (no script: the browser's own <details>)."""
    return f"<details><summary>{esc(summary)}</summary>\n{body}\n</details>"


# ---------------------------------------------------------------- figures


def png_figure(data: bytes, caption: str) -> str:
    """A figure of PNG ``data`` embedded in the page; bytes that are not a PNG are refused."""
    if not data.startswith(PNG_MAGIC):
        raise ValueError(f"figure {caption!r} is not a PNG image")
    encoded = base64.b64encode(data).decode("ascii")
    return (
        f'<figure><img alt="{esc(caption)}" src="data:image/png;base64,{encoded}">'
        f"<figcaption>{esc(caption)}</figcaption></figure>"
    )


def figure_bytes(fig, dpi: int = 100) -> bytes:
    """A matplotlib figure as PNG bytes (the figure is closed)."""
    from drmlab.experiments.plotting import pyplot

    buffer = io.BytesIO()
    try:
        fig.savefig(buffer, format="png", dpi=dpi)
    finally:
        pyplot().close(fig)
    return buffer.getvalue()


def drawn_figure(draw: Callable[[], bytes | None], caption: str) -> str:
    """The figure ``draw()`` returns as PNG bytes (nothing when it returns None); a figure that cannot
    be drawn becomes a note saying why -- a figure never costs the page its tables."""
    try:
        data = draw()
    except Exception as exc:
        return paragraph(f"{caption}: not drawn ({type(exc).__name__}: {exc})", "note")
    return png_figure(data, caption) if data else ""


# ---------------------------------------------------------------- the reports' markdown

_CODE = re.compile(r"`([^`]+)`")
_BOLD = re.compile(r"\*\*(.+?)\*\*")
_EMPHASIS = re.compile(r"(?<![\w*])\*(?![\s*])(.+?)(?<![\s*])\*(?![\w*])")


def inline(text: str) -> str:
    """One line of markdown text as escaped HTML with its code, bold and emphasis."""
    parts = _CODE.split(text)  # odd indices are code spans: no further formatting inside them
    out = []
    for i, part in enumerate(parts):
        if i % 2:
            out.append(f"<code>{esc(part)}</code>")
        else:
            escaped = esc(part)
            escaped = _BOLD.sub(r"<strong>\1</strong>", escaped)
            out.append(_EMPHASIS.sub(r"<em>\1</em>", escaped))
    return "".join(out)


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().removeprefix("|").removesuffix("|").split("|")]


def _markdown_table(lines: list[str]) -> str:
    header = _cells(lines[0])
    has_rule = len(lines) > 1 and all(re.fullmatch(r":?-{2,}:?", c) for c in _cells(lines[1]) if c)
    align = [c.endswith(":") for c in _cells(lines[1])] if has_rule else []
    rows = [_cells(line) for line in lines[2 if has_rule else 1 :]]

    def row_html(cells, tag):
        out = []
        for i, c in enumerate(cells):
            css = ' class="num"' if i < len(align) and align[i] else ""
            out.append(f"<{tag}{css}>{inline(c)}</{tag}>")
        return "<tr>" + "".join(out) + "</tr>"

    return (
        f"<table><thead>{row_html(header, 'th')}</thead><tbody>"
        + "".join(row_html(r, "td") for r in rows)
        + "</tbody></table>"
    )


def markdown_html(text: str, heading_shift: int = 1) -> str:
    """The reports' markdown (module docstring) as HTML; ``#`` becomes ``<h{1 + heading_shift}>``."""
    blocks: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if not stripped:
            i += 1
        elif stripped.startswith("#"):
            level = min(6, len(stripped) - len(stripped.lstrip("#")) + heading_shift)
            blocks.append(f"<h{level}>{inline(stripped.lstrip('#').strip())}</h{level}>")
            i += 1
        elif stripped.startswith("|"):
            start = i
            while i < len(lines) and lines[i].strip().startswith("|"):
                i += 1
            blocks.append(_markdown_table(lines[start:i]))
        elif re.match(r"[*-] ", stripped):
            items = []
            while i < len(lines) and re.match(r"[*-] ", lines[i].strip()):
                items.append(f"<li>{inline(lines[i].strip()[2:])}</li>")
                i += 1
            blocks.append("<ul>" + "".join(items) + "</ul>")
        else:
            start = i
            while (
                i < len(lines)
                and lines[i].strip()
                and not lines[i].strip().startswith(("#", "|"))
                and not re.match(r"[*-] ", lines[i].strip())
            ):
                i += 1
            blocks.append("<p>" + " ".join(inline(line.strip()) for line in lines[start:i]) + "</p>")
    return "\n".join(blocks)


# ---------------------------------------------------------------- the page


def page(title: str, subtitle: str, body: Iterable[str]) -> str:
    """The whole document: UTF-8, the policy, the inline style, ``title`` and ``body`` (already HTML)."""
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en">',
            "<head>",
            '<meta charset="utf-8">',
            f'<meta http-equiv="Content-Security-Policy" content="{CONTENT_SECURITY_POLICY}">',  # a constant, no quote
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>{esc(title)}</title>",
            f"<style>{STYLE}</style>",
            "</head>",
            "<body>",
            f"<h1>{esc(title)}</h1>",
            f'<p class="subtitle">{esc(subtitle)}</p>' if subtitle else "",
            *[part for part in body if part],
            "</body>",
            "</html>",
            "",
        ]
    )
