"""Render report pages: Markdown, CSV (one file per table) and one static HTML page.

The HTML page is the Markdown of every page rendered by ``markdown-it-py`` (CommonMark with
tables), with each figure embedded as a base64 data URI, so it opens offline as one file.
"""

from __future__ import annotations

import base64
import csv
import html
import io
import posixpath
from pathlib import Path

from d2kbench.report.document import Cell, Column, Page, Table

# Imports inside functions: markdown-it (the report extra) loads when HTML is rendered.


def cell_text(value: Cell, column: Column) -> str:
    """A cell as printed: ``-`` for None, numbers through the column's format spec."""
    if value is None:
        return "-"
    if isinstance(value, (int, float)) and not isinstance(value, bool) and column.fmt:
        return format(value, column.fmt)
    return str(value)


def table_markdown(table: Table) -> str:
    """A Markdown (GFM) table with its title in bold above it and its notes below."""
    esc = lambda s: s.replace("|", "\\|").replace("\n", " ")  # noqa: E731
    lines = [f"**{table.title}**", "", "| " + " | ".join(esc(c.name) for c in table.columns) + " |",
             "|" + "|".join("---:" if c.fmt else "---" for c in table.columns) + "|"]
    for row in table.rows:
        lines.append("| " + " | ".join(esc(cell_text(v, c)) for v, c in zip(row, table.columns)) + " |")
    if not table.rows:
        lines.append("| " + " | ".join(["(none)"] + [""] * (len(table.columns) - 1)) + " |")
    if table.notes:
        lines.append("")
        lines += [f"- {n}" for n in table.notes]
    return "\n".join(lines)


def table_csv(table: Table) -> str:
    """CSV text of a table: the header, then raw values (floats unrounded, None empty)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([c.name for c in table.columns])
    for row in table.rows:
        w.writerow(["" if v is None else repr(v) if isinstance(v, float) else v for v in row])
    return buf.getvalue()


def page_markdown(page: Page, path: str) -> str:
    """The Markdown of ``page`` stored at ``path`` (relative to the report folder); figure links
    are made relative to it."""
    here = posixpath.dirname(path)
    out = [f"# {page.title}", ""]
    if page.header:
        out += [f"- {h}" for h in page.header] + [""]
    for sec in page.sections:
        out += [f"## {sec.title}", ""]
        for para in sec.text:
            out += [para, ""]
        for t in sec.tables:
            if t.markdown:
                out += [table_markdown(t), ""]
        if sec.figure:
            out += [f"![{sec.caption or sec.title}]({posixpath.relpath(sec.figure, here or '.')})", ""]
    return "\n".join(out).rstrip() + "\n"


def _anchor(path: str) -> str:
    return "page-" + path.removesuffix(".md").replace("/", "-")


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1em;font-size:.9em}
th,td{border:1px solid #ccc;padding:.25em .6em}th{background:#f3f3f3}
tr:nth-child(even) td{background:#fafafa}img{max-width:100%}
section.page{border-top:3px solid #333;margin-top:2.5em}nav a{margin-right:1em}
"""


def html_page(pages: list[tuple[str, str]], root: Path, title: str) -> str:
    """One self-contained HTML document of several Markdown pages.

    Args:
        pages: (path relative to ``root``, Markdown text) per page, the main page first.
        root: the report folder; figure links are resolved against each page's folder and
            embedded as base64 PNG data URIs; links to other pages become in-page anchors.
        title: the document title.

    Raises:
        FileNotFoundError: a figure the Markdown links to does not exist.
    """
    from markdown_it import MarkdownIt

    md = MarkdownIt("commonmark", {"html": False}).enable("table")
    known = {p for p, _ in pages}
    body = []
    for path, text in pages:
        here = posixpath.dirname(path)
        tokens = md.parse(text)
        for tok in tokens:
            for child in tok.children or []:
                if child.type == "image":
                    src = posixpath.normpath(posixpath.join(here, str(child.attrGet("src"))))
                    data = base64.b64encode((root / src).read_bytes()).decode("ascii")
                    child.attrSet("src", f"data:image/png;base64,{data}")
                elif child.type == "link_open":
                    href = posixpath.normpath(posixpath.join(here, str(child.attrGet("href"))))
                    if href in known:
                        child.attrSet("href", "#" + _anchor(href))
        html_body = md.renderer.render(tokens, md.options, {})
        body.append(f'<section class="page" id="{_anchor(path)}">\n{html_body}</section>')
    nav = " ".join(f'<a href="#{_anchor(p)}">{html.escape(p.removesuffix(".md"))}</a>' for p, _ in pages)
    return (f"<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{_CSS}</style></head>\n<body>\n<nav>{nav}</nav>\n" + "\n".join(body) + "\n</body></html>\n")
