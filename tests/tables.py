"""Read back the tables the command line prints (``cli_common.FitTable``: no frame, columns
two or more spaces apart, a rule under a one-line header, a title above)."""

from __future__ import annotations


def table_lines(text: str) -> list[str]:
    """Every line that belongs to a table (title, header, rule, rows)."""
    return [line for group in _groups(text) for line in group]


def _groups(text: str) -> list[list[str]]:
    """Runs of consecutive lines of one length: a table renders every line (title, frame,
    header, rows) at the table's width."""
    groups: list[list[str]] = []
    last = -1
    for line in text.splitlines():
        if line and len(line) == last:
            groups[-1].append(line)
        else:
            groups.append([line])
            last = len(line)
    return [g for g in groups if len(g) >= 2]


def _columns(lines: list[str]) -> list[tuple[int, int]]:
    """The character spans of the columns: runs between gutters, two or more positions
    blank on every line."""
    width = max(len(line) for line in lines)
    used = [any(i < len(line) and line[i] != " " for line in lines) for i in range(width)]
    spans: list[tuple[int, int]] = []
    start, gap = None, 0
    for i, on in enumerate([*used, False, False]):
        if on:
            if start is None:
                start = i
            gap = 0
        elif start is not None:
            gap += 1
            if gap == 2:
                spans.append((start, i - 1))
                start = None
    return spans


def _split(lines: list[str], spans: list[tuple[int, int]]) -> list[list[str]]:
    """Each line's cells; a line with an empty first cell continues the row above (a cell
    wrapped over several lines)."""
    rows: list[list[str]] = []
    for line in lines:
        cells = [line[a:b].strip() for a, b in spans]
        if rows and not cells[0]:
            rows[-1] = [f"{x} {y}".strip() for x, y in zip(rows[-1], cells, strict=True)]
        else:
            rows.append(cells)
    return rows


def tables(text: str) -> list[tuple[list[str], list[list[str]]]]:
    """Each table of the output: its header cells ([] without a header) and its body rows
    (a table without a header has a title, its first line)."""
    found = []
    for group in _groups(text):
        rule = next((i for i, line in enumerate(group) if set(line.strip()) == {"─"}), None)
        if rule == 0:
            continue
        head = [] if rule is None else [group[rule - 1]]
        body = [line for line in group[1 if rule is None else rule + 1 :] if line.strip()]
        if not body:
            continue
        spans = _columns(head + body)
        header = _split(head, spans)[0] if head else []
        found.append((header, _split(body, spans)))
    return found


def table_rows(text: str) -> list[list[str]]:
    """The body rows of every table in the output."""
    return [row for _, rows in tables(text) for row in rows]


def table(text: str) -> list[dict[str, str]]:
    """The body rows of the first table, keyed by their column headings."""
    header, rows = tables(text)[0]
    return [dict(zip(header, row, strict=True)) for row in rows]
