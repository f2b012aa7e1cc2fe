"""autopar: automatic parallelization of PyTorch training steps."""
from autopar.api import plan
from autopar.mesh import Mesh
from autopar.placement import Partial, Replicate, Shard, Spec
from autopar.plan import Plan

__all__ = ["plan", "Plan", "Mesh", "Shard", "Replicate", "Partial", "Spec"]
