"""The on-disk plan cache: ``autopar.plan`` of the same step and options loads the plan
instead of solving again.

An entry is the plan's JSON in ``<dir>/<key>.json``, in a directory private to the user; an
entry or directory another user could have written is not used (a plan file becomes a
program, so it is trusted only when it is the user's own). The key covers everything that
decides the plan: the captured graph, the candidate meshes, the full hardware spec, the
options and the code (autopar's sources, torch and OR-Tools), so editing autopar or
recalibrating the hardware misses. A plan shaped by Python code the key cannot see (a
``restrict`` callable, custom or registered passes, registered rules) is never cached.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
import stat
import tempfile
import time
import warnings
from dataclasses import replace
from pathlib import Path

from autopar.ir.graph import fingerprint_of
from autopar.ir.plan import Plan
from autopar.ir.program import Program
from autopar.ir.records import PassRecord
from autopar.ir.request import PlanRequest
from autopar.ops.table import NAMED_RULES, RULES
from autopar.passes.registry import registered_passes

# autopar's own rules, as imported: register_rule can only run after this module is imported,
# because importing autopar imports it
_BUILTIN_RULES = (dict(RULES), dict(NAMED_RULES))


def default_dir() -> str:
    """``$AUTOPAR_CACHE_DIR``, else ``autopar/plans`` in the user's cache directory."""
    if os.environ.get("AUTOPAR_CACHE_DIR"):
        return os.environ["AUTOPAR_CACHE_DIR"]
    cache_home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache_home, "autopar", "plans")


def cacheable(restrict, passes) -> bool:
    """False where code the key cannot see decides the plan."""
    rules_unchanged = _same_entries(RULES, _BUILTIN_RULES[0]) and _same_entries(NAMED_RULES, _BUILTIN_RULES[1])
    return restrict is None and not passes and not registered_passes() and rules_unchanged


@functools.cache
def code_version() -> str:
    """A hash of autopar's source files and the versions of the libraries that shape a plan."""
    digest = hashlib.sha256()
    root = Path(__file__).parent.parent  # the autopar package
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    for library in ("torch", "ortools"):
        digest.update(f"{library}={importlib.metadata.version(library)}\0".encode())
    return digest.hexdigest()


def plan_key(program: Program, request: PlanRequest) -> str:
    """The key of a plan of ``program`` for ``request`` (its meshes resolved: "dp=2,tp=2" and
    {"dp": 2, "tp": 2} share entries, and "auto" is keyed by the world size it resolved to)."""
    body = {"graph": fingerprint_of(program), "request": request.key(), "code": code_version()}
    text = json.dumps(body, sort_keys=True, default=str)  # default: a pin given as a Spec
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def load(key: str, directory: str | None = None) -> Plan | None:
    """The cached plan, its history ending with where it came from; None on a miss. An entry
    another user could have written is ignored with a warning, as ssh ignores such keys."""
    path = os.path.join(directory or default_dir(), f"{key}.json")
    start = time.perf_counter()
    try:
        with open(path, opener=_no_links) as f:
            untrusted = _untrusted(os.fstat(f.fileno()))
            if untrusted:
                warnings.warn(f"ignoring the plan cache entry {path}: it {untrusted}, so another user could have "
                              f"written it; remove it (or the cache directory) to cache plans there again",
                              stacklevel=3)
                return None
            plan = Plan.from_json(f.read())
    except Exception:  # noqa: BLE001 - no entry, or an unreadable, corrupt or old one: a miss (store replaces it)
        return None
    record = PassRecord("cache", time.perf_counter() - start, f"loaded from {path}")
    return replace(plan, history=plan.history + (record,))


def store(key: str, plan: Plan, directory: str | None = None) -> None:
    """Write atomically (a reader never sees half an entry); a failure warns, since the plan is made."""
    directory = directory or default_dir()
    tmp = None
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        untrusted = _untrusted(os.stat(directory))
        if untrusted:
            warnings.warn(f"not caching plans in {directory}: the directory {untrusted}, so another user could "
                          f"change its entries; make it yours and private (chmod 700) or pass cache_dir=",
                          stacklevel=3)
            return
        with tempfile.NamedTemporaryFile("w", dir=directory, suffix=".tmp", delete=False) as f:
            tmp = f.name
            f.write(plan.to_json())
        os.replace(tmp, os.path.join(directory, f"{key}.json"))
    except OSError as exc:
        warnings.warn(f"could not write the plan cache in {directory} ({exc}); the plan is not cached",
                      stacklevel=3)
        if tmp is not None and os.path.exists(tmp):
            os.remove(tmp)


def _untrusted(status: os.stat_result) -> str | None:
    """Why a file or directory with ``status`` may hold another user's writing (None: only ours)."""
    if hasattr(os, "getuid") and status.st_uid != os.getuid():
        return f"belongs to user id {status.st_uid}, not to this user ({os.getuid()})"
    if status.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"is writable by its group or by everyone (mode {stat.S_IMODE(status.st_mode):o})"
    return None


def _no_links(path: str, flags: int) -> int:
    """Open without following a symbolic link (where the system can): an entry is a plain file of ours."""
    return os.open(path, flags | getattr(os, "O_NOFOLLOW", 0))


def _same_entries(current: dict, builtin: dict) -> bool:
    return len(current) == len(builtin) and all(current.get(op) is rule for op, rule in builtin.items())
