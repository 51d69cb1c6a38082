"""The Markdown report as plain HTML: headings (with GitHub's anchors, so the matrix's links work in both), tables,
lists, images, inline code, links and bold; everything else a paragraph. Only the Markdown ci.report writes."""

from __future__ import annotations

import html
import re

from ci.report_outcomes import slug

_STYLE = (
    "<style>body{font-family:sans-serif;max-width:1400px}td,th{border:1px solid #ccc;padding:2px 6px;"
    "font-size:12px;vertical-align:top}table{border-collapse:collapse;margin:8px 0}li{font-size:13px}"
    "code{font-size:11px;background:#f4f4f4}</style>"
)
_CODE = re.compile(r"`([^`]*)`")
_LINK = re.compile(r"\[((?:\\.|[^\]\\])*)\]\(([^)\s]+)\)")
_BOLD = re.compile(r"\*\*(.+?)\*\*")


def inline(text: str) -> str:
    """``code``, [links](#x) and **bold** of one line, the rest escaped."""
    out, last = [], 0
    for m in _CODE.finditer(text):
        out += [_plain(text[last : m.start()]), f"<code>{html.escape(m.group(1))}</code>"]
        last = m.end()
    return "".join(out + [_plain(text[last:])])


def _bold(text: str) -> str:
    return _BOLD.sub(r"<b>\1</b>", html.escape(text))


def _plain(text: str) -> str:
    out, last = [], 0
    for m in _LINK.finditer(text):
        label = re.sub(r"\\(.)", r"\1", m.group(1))  # the matrix escapes brackets in its links' text
        out += [_bold(text[last : m.start()]), f'<a href="{html.escape(m.group(2))}">{_bold(label)}</a>']
        last = m.end()
    return "".join(out + [_bold(text[last:])])


def _cells(line: str) -> list[str]:
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


def to_html(text: str) -> str:
    out = ["<!doctype html><meta charset=utf-8><title>moe-conformance report</title>", _STYLE]
    block = None  # "table" or "ul" while one is open
    for line in text.splitlines():
        kind = "table" if line.startswith("|") else "ul" if line.startswith(("- ", "  ")) and line.strip() else None
        if block and kind != block:
            out.append(f"</{block}>")
            block = None
        if kind == "table":
            if set(line.replace("|", "").strip()) <= set("-"):
                continue
            tag = "th" if block is None else "td"
            out.append(
                ("<table>" if block is None else "")
                + "<tr>"
                + "".join(f"<{tag}>{inline(c)}</{tag}>" for c in _cells(line))
                + "</tr>"
            )
            block = "table"
        elif kind == "ul":
            if block is None:
                out.append("<ul>")
                block = "ul"
            if line.startswith("- "):
                out.append(f"<li>{inline(line[2:])}")
            else:  # a continuation line of the item above (its reproduction)
                out.append(f"<br>{inline(line.strip())}")
        elif line.startswith("#"):
            level, title = len(line) - len(line.lstrip("#")), line.lstrip("# ")
            out.append(f'<h{level} id="{html.escape(slug(title))}">{inline(title)}</h{level}>')
        elif line.startswith("!["):
            src = line[line.index("(") + 1 : -1]
            out.append(f'<p><img src="{html.escape(src)}" style="max-width:100%"></p>')
        elif line.strip():
            out.append(f"<p>{inline(line)}</p>")
    if block:
        out.append(f"</{block}>")
    return "\n".join(out) + "\n"
