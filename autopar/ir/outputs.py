"""What a model's forward returns, as a plan records it: the tree of its output (a tensor, a
tuple, a dict, a Hugging Face ModelOutput) and what each leaf is: the loss, a value the forward
program returns, a constant, or an object the programs cannot return (a KV cache), dropped."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch.utils._pytree as pytree

from autopar.errors import CaptureError

JSON_LEAVES = (bool, int, float, str, type(None))


@dataclass(frozen=True)
class OutputTree:
    spec: str  # torch's pytree spec of the output, serialized (treespec_dumps)
    # per leaf, in pytree order: {"loss": True}, {"value": index into the graph's values, "name": its
    # key path ("logits")}, {"constant": json value} or {"dropped": type name}
    leaves: tuple[dict, ...]

    @staticmethod
    def of(spec: pytree.TreeSpec, leaves: list[dict], model_name: str) -> OutputTree:
        try:
            text = pytree.treespec_dumps(spec)
        except Exception as exc:  # torch raises several types for an unregistered node type
            raise CaptureError(f"{model_name} returns a structure torch cannot serialize ({exc}); return a "
                               f"tensor, a tuple, a list, a dict or a dataclass registered with "
                               f"torch.utils._pytree.register_pytree_node(..., serialized_type_name=...)") from exc
        return OutputTree(text, tuple(leaves))

    @property
    def value_names(self) -> list[str]:
        return [leaf["name"] for leaf in sorted((x for x in self.leaves if "value" in x), key=lambda x: x["value"])]

    @property
    def dropped(self) -> list[str]:
        return [leaf["dropped"] for leaf in self.leaves if "dropped" in leaf]

    def rebuild(self, loss: Any, values: list) -> Any:
        """The model's output with ``loss`` and ``values`` in their places (a dropped leaf is None)."""
        leaves = []
        for leaf in self.leaves:
            if "loss" in leaf:
                leaves.append(loss)
            elif "value" in leaf:
                leaves.append(values[leaf["value"]])
            else:
                leaves.append(leaf.get("constant"))
        return pytree.tree_unflatten(leaves, pytree.treespec_loads(self.spec))

    def to_json(self) -> dict:
        return {"spec": self.spec, "leaves": list(self.leaves)}

    @staticmethod
    def from_json(d: dict | None) -> OutputTree | None:
        return None if d is None else OutputTree(d["spec"], tuple(d["leaves"]))
