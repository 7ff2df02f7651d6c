"""Stream the records of a JSON file: a top-level array, JSON Lines, or one object.

``json.load`` needs the whole file in memory; conversation dumps (ShareGPT, LMSys-Chat)
run to gigabytes. This reader decodes one record at a time from a sliding buffer and
reports the line each record starts on, so errors can name it.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterator
from pathlib import Path

from prefixlab.errors import TraceFormatError
from prefixlab.types import JSON

_CHUNK = 1 << 20
_WS = " \t\r\n"
_NUMBER = "0123456789+-.eE"


class _Buffer:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.fh = path.open("rb")
        self.decoder = codecs.getincrementaldecoder("utf-8-sig")()
        self.text = ""
        self.pos = 0
        self.line = 1  # line number at self.pos
        self.eof = False

    def fill(self) -> bool:
        """Read more text; False at end of file."""
        if self.eof:
            return False
        raw = self.fh.read(_CHUNK)
        try:
            chunk = self.decoder.decode(raw, final=not raw)
        except UnicodeDecodeError:
            line = self.line + self.text.count("\n", self.pos)
            raise TraceFormatError(str(self.path), line, None, "not UTF-8 text") from None
        if not raw:
            self.eof = True
            return False
        self.text = self.text[self.pos :] + chunk
        self.pos = 0
        return True

    def advance(self, new_pos: int) -> None:
        self.line += self.text.count("\n", self.pos, new_pos)
        self.pos = new_pos

    def skip_ws(self) -> str | None:
        """Skip whitespace; the next character, or None at end of file."""
        while True:
            n = len(self.text)
            p = self.pos
            while p < n and self.text[p] in _WS:
                p += 1
            self.advance(p)
            if p < n:
                return self.text[p]
            if not self.fill():
                return None

    def value(self, decoder: json.JSONDecoder) -> JSON:
        obj: JSON  # what raw_decode gives
        while True:
            try:
                obj, end = decoder.raw_decode(self.text, self.pos)
            except json.JSONDecodeError as exc:
                # Read on only when the value may run past the buffer: the error is at its
                # very end (a cut number or literal), or a string is still open (strings
                # cannot span lines, so that is bounded). Anything else is a real error,
                # reported at once: a bad record must not make us read the rest of the file.
                cut = exc.pos >= len(self.text) - 64 or exc.msg.startswith("Unterminated")
                if cut and self.fill():
                    continue
                line = self.line + self.text.count("\n", self.pos, exc.pos)
                raise TraceFormatError(str(self.path), line, None, f"bad JSON: {exc.msg}") from None
            rest = self.text[end:]
            if not self.eof and not rest.strip(_NUMBER) and self.fill():
                # The buffer ends inside what may be one number ("1." of "1.5"): read on.
                continue
            self.advance(end)
            return obj

    def close(self) -> None:
        self.fh.close()


def iter_json_records(path: Path) -> Iterator[tuple[int, JSON]]:
    """Yield ``(line, record)``: the items of a top-level array, else each top-level value."""
    buf = _Buffer(path)
    decoder = json.JSONDecoder()
    try:
        first = buf.skip_ws()
        if first is None:
            return
        if first != "[":
            while buf.skip_ws() is not None:
                line = buf.line
                yield line, buf.value(decoder)
            return
        buf.advance(buf.pos + 1)
        expect_item = True
        after_comma = False
        while True:
            c = buf.skip_ws()
            if c is None:
                raise TraceFormatError(str(path), buf.line, None, "bad JSON: unterminated array")
            if c == "]":
                if expect_item and after_comma:
                    raise TraceFormatError(
                        str(path), buf.line, None, "bad JSON: trailing comma in the array"
                    )
                buf.advance(buf.pos + 1)
                break
            if not expect_item:
                if c != ",":
                    raise TraceFormatError(
                        str(path), buf.line, None, "bad JSON: expected ',' or ']' in the array"
                    )
                buf.advance(buf.pos + 1)
                expect_item = after_comma = True
                continue
            line = buf.line
            yield line, buf.value(decoder)
            expect_item = False
        if buf.skip_ws() is not None:
            raise TraceFormatError(str(path), buf.line, None, "bad JSON: text after the array")
    finally:
        buf.close()
