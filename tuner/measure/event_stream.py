"""Measure stage, the event stream: server-sent events parsed from a response body's bytes as
they arrive, as the WHATWG HTML standard says, for the load generator's HTTP client
(tuner.measure.http_client).
"""

from __future__ import annotations


class EventStream:
    """Server-sent events from bytes as they arrive, as the WHATWG HTML standard parses them
    ("Parsing an event stream"): lines end in CRLF, LF or CR; a line that opens with `:` is a
    comment (servers send `: ping` to keep a connection alive); fields are data, event, id and
    retry, others are ignored; data lines join with LF; a blank line dispatches the event, and
    an event without data is none. Bytes stay bytes: the JSON decoder reads UTF-8 itself."""

    def __init__(self) -> None:
        self._line = b""  # an unfinished line
        self._after_cr = False  # the last line ended in CR: a LF that comes next ends no line
        self._first = True  # a byte-order mark may open the stream
        self._data: list[bytes] = []
        self._type = b""
        self.last_id = b""
        self.retry_ms: int | None = None

    def feed(self, data: bytes) -> list[tuple[bytes, bytes]]:
        """The (type, data) of every event that `data` completes, in order."""
        if self._after_cr and data:
            self._after_cr = False
            if data[:1] == b"\n":
                data = data[1:]
        buf = self._line + data if self._line else data
        if not buf:
            return []
        # bytes.splitlines breaks at CRLF, LF and CR only (str.splitlines would break at more).
        lines = buf.splitlines()
        self._after_cr = buf.endswith(b"\r")
        self._line = b"" if buf.endswith((b"\n", b"\r")) else lines.pop()
        if self._first and lines:
            self._first = False
            lines[0] = lines[0].removeprefix(b"\xef\xbb\xbf")
        events = []
        for line in lines:
            if not line:
                if self._data:
                    events.append((self._type or b"message", b"\n".join(self._data)))
                self._data, self._type = [], b""
                continue
            name, colon, value = line.partition(b":")
            if not name:
                continue  # a comment
            if colon and value[:1] == b" ":
                value = value[1:]
            if name == b"data":
                self._data.append(value)
            elif name == b"event":
                self._type = value
            elif name == b"id":
                if b"\0" not in value:
                    self.last_id = value
            elif name == b"retry" and value.isdigit():
                self.retry_ms = int(value)
        return events
