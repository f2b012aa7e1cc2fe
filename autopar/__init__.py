"""autopar: automatic parallelization of PyTorch training steps."""
import autopar.backends  # noqa: F401  registers Plan.emit's backends
import autopar.inspect  # noqa: F401  registers Plan.summary and Plan.explain
from autopar.api import plan
from autopar.backends.jax.user_ops import register_jax_translation
from autopar.baseline_plans import Baselines, baselines
from autopar.check import CheckReport, check
from autopar.cost_models.hardware import PRESETS, Hardware, Link
from autopar.cost_models.routing import routing_imbalance
from autopar.errors import (
    AutoparError,
    CaptureError,
    CollectiveTimeoutError,
    MeshError,
    PlanFormatError,
    PlanMismatchError,
    SolverError,
)
from autopar.inspect.diff import PlanDiff, diff
from autopar.ir.mesh import Mesh
from autopar.ir.placement import Partial, Replicate, Shard, Spec
from autopar.ir.plan import Plan
from autopar.ir.precision import MixedPrecision
from autopar.ops.table import register_rule
from autopar.ops.validation import RuleReport, validate_rule
from autopar.optim import KFAC
from autopar.parallelize import autoparallelize, data_parallel_info, plan_of, prepare
from autopar.passes.base import Pass, PassContext
from autopar.passes.constraints import Constraints
from autopar.passes.registry import register_pass, registered_passes, unregister_pass
from autopar.profile import ProfileReport, profile
from autopar.runtime.clipping import clip_grad_norm_

__all__ = [
    "plan", "baselines", "Baselines", "check", "CheckReport", "profile", "ProfileReport", "diff", "PlanDiff",
    "autoparallelize", "prepare",
    "data_parallel_info", "plan_of", "register_pass", "unregister_pass", "registered_passes", "Pass", "PassContext",
    "Constraints", "register_rule", "validate_rule", "RuleReport", "register_jax_translation", "Plan",
    "MixedPrecision", "Mesh", "Shard",
    "Replicate", "Partial", "Spec",
    "Hardware", "Link", "PRESETS", "AutoparError", "CaptureError", "MeshError", "PlanFormatError", "PlanMismatchError",
    "CollectiveTimeoutError",
    "SolverError", "KFAC", "clip_grad_norm_", "routing_imbalance",
]
