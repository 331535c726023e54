"""Pure functions from captures to verdict numbers: conversions, derived hooks, metrics, routing flips, evaluation of a plan, and the gate with its data (tolerances, known reference bugs)."""
