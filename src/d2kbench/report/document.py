"""The plain-data shape of a report: pages of sections holding tables, text and figures.

Tables keep raw values (full-precision floats, ints, strings, None); a column's ``fmt`` (a
Python format spec such as ``.3f`` or ``.1%``) is applied only when a page is rendered.
"""

from __future__ import annotations

from pydantic import BaseModel

Cell = float | int | str | None


class Column(BaseModel):
    """A table column: its header and the format spec of its numbers (``""``: ``str()``)."""

    name: str
    fmt: str = ""


class Table(BaseModel):
    """A titled table; ``key`` names its CSV file; ``markdown=False``: CSV only (long data)."""

    key: str
    title: str
    columns: list[Column]
    rows: list[list[Cell]] = []
    notes: list[str] = []
    markdown: bool = True


class Section(BaseModel):
    """A page section: paragraphs, tables and an optional figure (a PNG path relative to the
    report folder, with its caption)."""

    title: str
    text: list[str] = []
    tables: list[Table] = []
    figure: str | None = None
    caption: str = ""


class Page(BaseModel):
    """One page: the report's main page or a task page (``slug`` names its files)."""

    slug: str
    title: str
    header: list[str] = []
    sections: list[Section] = []
