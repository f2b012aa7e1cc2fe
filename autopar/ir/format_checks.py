"""The checks a plan file's fields get (autopar.ir.plan_format puts them together): what a
string may contain, a number's range, a list's length, an object's fields. Each takes the
value and its path in the file (``graph.nodes[3].target``) and raises PlanFormatError naming
that path and the rule broken."""
from __future__ import annotations

import keyword
import math
import re
import unicodedata
from collections.abc import Callable
from typing import Any

import torch

from autopar.errors import PlanFormatError

Check = Callable[[Any, str], None]

MAX_LABEL = 4096  # characters of a label (a note, a status, a module path)
MAX_TEXT = 1 << 20  # characters of a structure description
MAX_ITEMS = 1 << 24  # entries of any list or mapping
MAX_SIZE = 1 << 48  # a tensor dim, a byte count, an element count
MAX_RANK = 16  # dims of a tensor
MAX_AXES = 8  # axes of a mesh
MAX_NESTING = 8  # lists inside an op's arguments

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DOTTED = re.compile(r"[^\s.]+(\.[^\s.]+)*")
_TARGET = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*")
_PLACEMENT = re.compile(r"R|P|S\((\d{1,2})\)")
_DEVICE = re.compile(r"[a-z]{1,16}(:\d{1,4})?")
_ACTION = re.compile(r"\d{1,4}[FBIW]\d{1,6}")


def fail(path: str, problem: str):
    raise PlanFormatError(f"the plan file is corrupt: its field {path} {problem}; re-create it with `autopar plan` "
                          f"(a plan file is checked before any program is made from it)")


# ---- strings ---------------------------------------------------------------------------------
def label(value, path: str, multiline: bool = False, limit: int = MAX_LABEL) -> None:
    """Text shown to people (comments, summaries): no line break or control character, so
    it can never end a comment in an emitted program."""
    if not isinstance(value, str):
        fail(path, f"must be a string, not {type(value).__name__}")
    if len(value) > limit:
        fail(path, f"is {len(value)} characters long (at most {limit})")
    for ch in value:
        if ch == "\n" and multiline:
            continue
        if unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"):
            fail(path, f"holds the control or line-separator character {ch!r}")


def text(value, path: str) -> None:
    label(value, path, multiline=True, limit=MAX_TEXT)


def identifier(value, path: str) -> None:
    """A name the programs print as a Python variable."""
    if not isinstance(value, str) or not _IDENTIFIER.fullmatch(value) or keyword.iskeyword(value) \
            or len(value) > 256:
        fail(path, f"must be a Python identifier (letters, digits, _), got {_shown(value)}")


def dotted(value, path: str) -> None:
    """A parameter's, buffer's or module's path: names without spaces joined by dots."""
    label(value, path)
    if not _DOTTED.fullmatch(value):
        fail(path, f"must be names without spaces joined by dots, got {_shown(value)}")


def module_path(value, path: str) -> None:
    """A module's path: dotted, or "" for the model itself."""
    if value != "":
        dotted(value, path)


def op_target(value, path: str) -> None:
    """An op as the programs call it: namespace.name.overload."""
    if not isinstance(value, str) or not _TARGET.fullmatch(value):
        fail(path, f"must name an op as namespace.op.overload, got {_shown(value)}")


def dtype(value, path: str) -> None:
    if not isinstance(value, str) or not isinstance(getattr(torch, value, None), torch.dtype) \
            or not _IDENTIFIER.fullmatch(value):
        fail(path, f"must be a torch dtype's name (float32, bfloat16, ...), got {_shown(value)}")


def _torch_attribute(kind: type, what: str) -> Check:
    def check(value, path: str) -> None:
        if not isinstance(value, str) or not _IDENTIFIER.fullmatch(value) \
                or not isinstance(getattr(torch, value, None), kind):
            fail(path, f"must be a torch {what}'s name, got {_shown(value)}")
    return check


layout = _torch_attribute(torch.layout, "layout")
memory_format = _torch_attribute(torch.memory_format, "memory format")


def device(value, path: str) -> None:
    if not isinstance(value, str) or not _DEVICE.fullmatch(value):
        fail(path, f"must be a device such as 'cpu' or 'cuda:0', got {_shown(value)}")


def spec(ndim: int) -> Check:
    """A layout on the mesh: one placement (R, P or S(dim)) per axis."""
    def check(value, path: str) -> None:
        if not isinstance(value, str):
            fail(path, f"must be a layout string such as 'S(0),R', not {type(value).__name__}")
        parts = value.split(",")
        if len(parts) != ndim or not all(_PLACEMENT.fullmatch(p) for p in parts):
            fail(path, f"must be {ndim} placements (R, P or S(dim)) joined by commas, got {_shown(value)}")
    return check


def action(value, path: str) -> None:
    """A pipeline action as the schedules print it: stage, F/B/I/W, micro-batch ("3F1")."""
    if not isinstance(value, str) or not _ACTION.fullmatch(value):
        fail(path, f"must be a pipeline action such as '3F1', got {_shown(value)}")


def one_of(*allowed) -> Check:
    def check(value, path: str) -> None:
        if value not in allowed or isinstance(value, bool) != any(isinstance(a, bool) for a in allowed):
            fail(path, f"must be one of {', '.join(map(repr, allowed))}, got {_shown(value)}")
    return check


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# ---- numbers ---------------------------------------------------------------------------------
def integer(low: int = 0, high: int = MAX_SIZE) -> Check:
    def check(value, path: str) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            fail(path, f"must be an integer from {low} to {high}, got {_shown(value)}")
    return check


def number(low: float = 0.0, high: float = math.inf, infinite: bool = False) -> Check:
    """A float (or an integer) in [low, high]; ``infinite``: inf allowed (a ruled-out candidate's time)."""
    def check(value, path: str) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) \
                or (math.isinf(value) and not infinite) or not (low <= value <= high or math.isinf(value)):
            fail(path, f"must be a number from {low} to {high}, got {_shown(value)}")
    return check


def boolean(value, path: str) -> None:
    if not isinstance(value, bool):
        fail(path, f"must be true or false, got {_shown(value)}")


# ---- containers ------------------------------------------------------------------------------
def list_of(item: Check, low: int = 0, high: int = MAX_ITEMS) -> Check:
    def check(value, path: str) -> None:
        if not isinstance(value, list):
            fail(path, f"must be a list, not {type(value).__name__}")
        if not low <= len(value) <= high:
            fail(path, f"must hold {low} to {high} entries, not {len(value)}")
        for i, v in enumerate(value):
            item(v, f"{path}[{i}]")
    return check


def mapping(key: Check, value_check: Check) -> Check:
    def check(value, path: str) -> None:
        if not isinstance(value, dict):
            fail(path, f"must be a mapping, not {type(value).__name__}")
        if len(value) > MAX_ITEMS:
            fail(path, f"holds {len(value)} entries (at most {MAX_ITEMS})")
        for k, v in value.items():
            key(k, f"{path} key {_shown(k)}")
            value_check(v, joined(path, k))
    return check


def nullable(inner: Check) -> Check:
    def check(value, path: str) -> None:
        if value is not None:
            inner(value, path)
    return check


def record(required: dict, optional: dict | None = None) -> Check:
    """A JSON object with exactly these fields (``optional`` ones may be absent)."""
    optional = optional or {}

    def check(value, path: str) -> None:
        if not isinstance(value, dict):
            fail(path or "the file", f"must be an object, not {type(value).__name__}")
        unknown = sorted(set(value) - set(required) - set(optional), key=str)
        if unknown:
            fail(joined(path, unknown[0]), "is not a field of the plan format")
        for name, field_check in required.items():
            if name not in value:
                fail(joined(path, name), "is missing")
            field_check(value[name], joined(path, name))
        for name, field_check in optional.items():
            if name in value:
                field_check(value[name], joined(path, name))
    return check


def joined(path: str, name) -> str:
    """The path of field ``name`` of the object at ``path`` ("" is the file itself)."""
    return f"{path}.{name}" if path else str(name)


def row(*items: Check) -> Check:
    """A fixed-length list whose entries have their own checks."""
    def check(value, path: str) -> None:
        if not isinstance(value, list) or len(value) != len(items):
            fail(path, f"must be a list of {len(items)} entries, got {_shown(value)}")
        for i, (v, item) in enumerate(zip(value, items)):
            item(v, f"{path}[{i}]")
    return check
