"""Sizes and durations as people write them: "60GiB" in, "1.5 GB" and "3.2 ms" out."""
from __future__ import annotations

import math

from autopar.errors import AutoparError

_UNITS = {"": 1, "B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_bytes(value: str | float | None) -> float | None:
    """``60e9``, ``"60GiB"``, ``"512 MB"`` -> bytes; None stays None (the default budget)."""
    if value is None or isinstance(value, (int, float)):
        if value is not None and value <= 0:
            raise AutoparError(f"memory_budget must be positive, got {value}")
        return value
    text = str(value).strip().upper().replace(" ", "")
    number = text.rstrip("KMGTIB")
    unit = text[len(number):]
    try:
        amount = float(number) * _UNITS[unit]
    except (KeyError, ValueError):
        raise AutoparError(f"cannot read memory_budget {value!r}; write bytes or e.g. '60GiB', '512MB'") from None
    return parse_bytes(amount)



def human_bytes(n: float) -> str:
    """Decimal units, as device memory is sold and as parse_bytes reads them: 72e9 is "72.0 GB"."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def bytes_at_least(n: float) -> str:
    """``n`` bytes rounded up to a tenth of a binary unit, in text parse_bytes reads back ("4.1MiB"):
    a budget that is at least ``n`` (human_bytes rounds to the nearest, which may be under it)."""
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        size = _UNITS[unit.upper()]
        if n < 1024 * size or unit == "TiB":
            return f"{math.ceil(n / size * 10) / 10:g}{unit}"


def human_seconds(s: float) -> str:
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3f} ms"
    return f"{s * 1e6:.1f} us"
