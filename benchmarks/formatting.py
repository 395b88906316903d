"""How the benchmark report writes a figure or a text inline: numbers to three
significant digits (thousands with separators), a text on one line of a table."""

from __future__ import annotations


def fmt(x, digits: int = 3) -> str:
    if x is None:
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int) or (isinstance(x, float) and abs(x) >= 1000):
        return f"{x:,.0f}"
    if abs(x) >= 100:
        return f"{x:.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.{digits - 1}f}" if abs(x) >= 1 else f"{x:.{digits}f}"


def oneline(s: str, n: int) -> str:
    s = " ".join(str(s).split()).replace("`", "'").replace("|", "/")
    return s[:n] + ("…" if len(s) > n else "")
