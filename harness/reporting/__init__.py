"""Pure functions from result rows to files: per-model reports, depth plots, the support matrix."""
