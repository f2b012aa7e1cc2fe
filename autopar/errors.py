"""Errors users see. Each message names the cause and what to do."""


class AutoparError(Exception):
    """Base class for every error autopar raises on purpose."""


class MeshError(AutoparError, ValueError):
    """The mesh is malformed or does not fit the process group."""


class CaptureError(AutoparError):
    """The model's training step could not be captured as one graph."""


class PlanFormatError(AutoparError, ValueError):
    """A plan file is corrupt or from an incompatible format version."""


class PlanMismatchError(AutoparError):
    """A plan was applied to a model it was not made for."""


class SolverError(AutoparError):
    """The sharding solver found no feasible plan."""
