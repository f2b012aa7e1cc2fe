"""Errors users see. Each message names the cause and what to do."""
import os
import sys

import torch

# frames inside autopar or torch (a module's call machinery) are not the user's line
_LIBRARY_DIRS = tuple(os.path.dirname(os.path.abspath(f)) + os.sep for f in (__file__, torch.__file__))


def in_library(filename: str) -> bool:
    """Whether a frame's file is autopar's or torch's: not the user's line."""
    return os.path.abspath(filename).startswith(_LIBRARY_DIRS)


def user_stacklevel() -> int:
    """The ``stacklevel`` for a warning given by the caller of this function that points at the
    first frame outside autopar and torch: the user's line that led to it."""
    level, frame = 1, sys._getframe(1)
    while frame is not None and in_library(frame.f_code.co_filename):
        level, frame = level + 1, frame.f_back
    return level


class AutoparError(Exception):
    """Base class for every error autopar raises on purpose."""


class MeshError(AutoparError, ValueError):
    """The mesh is malformed or does not fit the process group."""


class CaptureError(AutoparError):
    """The model's training step could not be captured as one graph."""


class NoLossError(CaptureError):
    """A training step was asked of a call whose output holds no loss."""


class PlanFormatError(AutoparError, ValueError):
    """A plan file is corrupt or from an incompatible format version."""


class PlanMismatchError(AutoparError):
    """A plan was applied to a model it was not made for."""


class CollectiveTimeoutError(AutoparError):
    """A collective of an emitted program did not complete in time: another rank is not running the step."""


class SolverError(AutoparError):
    """The sharding solver found no feasible plan."""
