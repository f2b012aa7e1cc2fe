"""torch.distributed.checkpoint's state dicts of a pipelined model's optimizer, in the form that
survives a checkpoint.

``get_state_dict`` / ``get_optimizer_state_dict`` give an optimizer's state dict nested, as
``optimizer.state_dict()`` does, with ``param_groups`` a list: each group names its parameters.
DCP saves that list under one key for every rank, keeping one rank's, and a pipeline's ranks
hold different parameters: a rank of another stage would load groups that name none of its
own (AdamW then fails at ``step()`` for want of ``betas``). The flattened form
(``StateDictOptions(flatten_optimizer_state_dict=True)``, torchtitan's setting) keys every
value by its parameter's name, so each rank saves and loads its own. Once a pipelined model
exists, torch's functions give that form for it whatever the options say (they look their
options up through ``_verify_options`` at every call, so a name imported before is routed
too); ``set_state_dict`` reads both forms. Load such a checkpoint elsewhere (a flat mesh, one
process) with the same option, so that the state dict DCP fills has the same keys.
"""
from __future__ import annotations

import functools
import weakref

_PIPELINED: weakref.WeakSet = weakref.WeakSet()  # the models (as the user holds them) that are pipelined


def register_pipelined_model(model) -> None:
    _PIPELINED.add(model)
    _route_state_dict_options()


def _route_state_dict_options() -> None:
    from torch.distributed.checkpoint import state_dict

    original = getattr(state_dict, "_verify_options", None)
    if original is None or getattr(original, "_autopar_routed", False):
        return

    @functools.wraps(original)
    def routed(model, optims, *args, **kwargs):
        info = original(model, optims, *args, **kwargs)
        if optims and model in _PIPELINED:
            info.flatten_optimizer_state_dict = True
        return info

    routed._autopar_routed = True
    state_dict._verify_options = routed
