"""autopar: automatic parallelization of PyTorch training steps."""
from autopar.api import plan
from autopar.baseline_plans import Baselines, baselines
from autopar.check import CheckReport, check
from autopar.constraints import Constraints
from autopar.cost_models.hardware import PRESETS, Hardware, Link
from autopar.diff import PlanDiff, diff
from autopar.errors import AutoparError, CaptureError, MeshError, PlanFormatError, PlanMismatchError, SolverError
from autopar.mesh import Mesh
from autopar.parallelize import autoparallelize, plan_of
from autopar.pass_registry import register_pass, registered_passes, unregister_pass
from autopar.passes.base import Pass, PassContext
from autopar.passes.rule_table import register_rule
from autopar.placement import Partial, Replicate, Shard, Spec
from autopar.plan import Plan

__all__ = [
    "plan", "baselines", "Baselines", "check", "CheckReport", "diff", "PlanDiff", "autoparallelize", "plan_of",
    "register_pass", "unregister_pass", "registered_passes", "Pass", "PassContext", "Constraints", "register_rule",
    "Plan", "Mesh", "Shard", "Replicate", "Partial", "Spec", "Hardware", "Link", "PRESETS", "AutoparError",
    "CaptureError", "MeshError", "PlanFormatError", "PlanMismatchError", "SolverError",
]
