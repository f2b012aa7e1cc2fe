"""Inspection: summary, explain, diff, show, the HTML report and progress display.

Importing this package registers ``Plan.summary`` and ``Plan.explain``."""
from autopar.inspect.explain import explain
from autopar.inspect.summary import summarize
from autopar.ir.plan import register_view
from autopar.planning.state import planning_state


def _explain(plan, target, model=None, example_inputs=None, hardware=None):
    program, ctx = planning_state(plan, model, example_inputs, hardware)
    return explain(plan, program, ctx, target)


register_view("summary", summarize)
register_view("explain", _explain)
