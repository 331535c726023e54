"""One (target, variant): the variant value, the plan, the result schema, and the orchestration that drives the engines."""
