"""Go's duration strings ("1h30m", "300ms", "-1.5h", ".5h"), read as Go's
time.ParseDuration reads them: the one parser for etcd's duration flags.

The grammar, as Go's time package has it: an optional sign, then one or
more parts, each a decimal number (digits, a point, digits: either side may
be empty, not both: "1.", ".5", "1.5") followed by its unit, one of ns, us,
µs (U+00B5), μs (U+03BC), ms, s, m, h.  A unit is everything up to the next
digit or point, so "1 h" has the unknown unit " h".  A number without a unit
is an error, except "0" alone (signed or not).  The result is a whole count
of nanoseconds within int64: a part's fraction is scaled by its unit in
float64 and cut towards zero; more fraction digits than an int64 holds are
read and dropped.  Nothing is stripped: " 1s" is an error, as in Go.

A leaf below every layer because two of them read durations: brain/engine's
compactor (--auto-compaction-retention) and brain/config (serve's duration
flags).  tests/test_go_duration.py holds it to Go's own results.
"""

from __future__ import annotations

NANOSECONDS = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,  # U+00B5 MICRO SIGN
    "μs": 1_000,  # U+03BC GREEK SMALL LETTER MU
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
}
_UNITS = {unit.encode(): ns for unit, ns in NANOSECONDS.items()}
_LIMIT = 1 << 63  # a count's magnitude: int64's, one more below zero
_DIGITS = b"0123456789"


class DurationError(ValueError):
    """A string Go's time.ParseDuration refuses, with Go's message."""

    def __init__(self, problem: str, text: str) -> None:
        super().__init__(f"time: {problem} {_go_quote(text)}")


def nanoseconds(text: str) -> int:
    """The duration ``text`` names, in nanoseconds; DurationError when Go's
    time.ParseDuration would return an error."""
    s = text.encode("utf-8", "surrogateescape")
    negative = s[:1] == b"-"
    if s[:1] in (b"-", b"+"):
        s = s[1:]
    if s == b"0":
        return 0
    if not s:
        raise DurationError("invalid duration", text)
    total = 0
    pos = 0
    while pos < len(s):
        part, pos = _part(s, pos, text)
        total = (total + part) % (1 << 64)  # Go adds in uint64: two parts of 2**63 wrap to 0
        if total > _LIMIT:
            raise DurationError("invalid duration", text)
    if negative:
        return -total
    if total >= _LIMIT:
        raise DurationError("invalid duration", text)
    return total


def seconds(text: str) -> float:
    """The duration ``text`` names, in seconds."""
    return nanoseconds(text) / 1e9


def _part(s: bytes, pos: int, text: str) -> tuple[int, int]:
    """One number and its unit from ``s[pos:]``: (its nanoseconds, where the
    next part starts)."""
    if s[pos] not in _DIGITS and s[pos:pos + 1] != b".":
        raise DurationError("invalid duration", text)
    whole_end = _digits_end(s, pos)
    whole = int(s[pos:whole_end] or b"0")
    if whole > _LIMIT:
        raise DurationError("invalid duration", text)
    fraction, scale, end = 0, 1.0, whole_end
    if s[end:end + 1] == b".":
        end = _digits_end(s, end + 1)
        fraction, scale = _fraction(s[whole_end + 1:end])
        if whole_end == pos and end == whole_end + 1:  # a point alone: ".s"
            raise DurationError("invalid duration", text)
    unit_end = end
    while unit_end < len(s) and s[unit_end] not in _DIGITS and s[unit_end:unit_end + 1] != b".":
        unit_end += 1
    if unit_end == end:
        raise DurationError("missing unit in duration", text)
    unit = _UNITS.get(s[end:unit_end])
    if unit is None:
        name = s[end:unit_end].decode("utf-8", "surrogateescape")
        raise DurationError(f"unknown unit {_go_quote(name)} in duration", text)
    if whole > _LIMIT // unit:
        raise DurationError("invalid duration", text)
    value = whole * unit
    if fraction:
        value += int(float(fraction) * (float(unit) / scale))
        if value > _LIMIT:
            raise DurationError("invalid duration", text)
    return value, unit_end


def _digits_end(s: bytes, pos: int) -> int:
    while pos < len(s) and s[pos] in _DIGITS:
        pos += 1
    return pos


def _fraction(digits: bytes) -> tuple[int, float]:
    """The digits after a point as (numerator, scale), value = numerator /
    scale; digits past what fits below 2**63 are dropped, as Go drops them."""
    numerator, scale = 0, 1.0
    for d in digits:
        more = numerator * 10 + d - 48
        if more > _LIMIT:
            break
        numerator, scale = more, scale * 10
    return numerator, scale


def _go_quote(text: str) -> str:
    """``text`` in double quotes as Go's time package quotes it in errors:
    quotes and backslashes escaped, other bytes outside printable ASCII as \\xNN."""
    out = []
    for ch in text:
        if ch < " " or ch >= "\x80":
            out += [f"\\x{b:02x}" for b in ch.encode("utf-8", "surrogateescape")]
        elif ch in '"\\':
            out.append("\\" + ch)
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'
