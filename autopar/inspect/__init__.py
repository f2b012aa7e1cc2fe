"""Inspection: summary, explain, diff, show, the HTML report and progress display.

Importing this package registers ``Plan.summary`` and ``Plan.explain``."""
from autopar.inspect.explain import explain
from autopar.inspect.offload_view import explain_offload
from autopar.inspect.pipeline_view import explain_pipeline
from autopar.inspect.summary import summarize
from autopar.inspect.trace import write_trace
from autopar.ir.plan import register_view
from autopar.planning.state import planning_state


def _explain(plan, target, model=None, example_inputs=None, hardware=None):
    if target == "pp":  # the pipeline's decisions, which the plan carries whole
        return explain_pipeline(plan)
    if target == "offload" or target.startswith("chunk "):  # likewise the offload's
        return explain_offload(plan, target)
    program, ctx = planning_state(plan, model, example_inputs, hardware)
    return explain(plan, program, ctx, target)


register_view("summary", summarize)
register_view("explain", _explain)
register_view("trace", write_trace)
