"""Orchestration, above everything else but the front ends: one (target, variant) run (runner), the planted-fault sweep, capture invariance and declared refusals."""
