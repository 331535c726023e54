"""Benchmarks, never collected by CI's ``pytest`` (outside ``testpaths``; skipped unless this folder
or a file in it is named): the pytest-benchmark benchmarks ``test_bench_capture_cost.py`` and
``test_bench_suite.py`` (``pytest benchmarks/ --benchmark-autosave``, docs/benchmarks.md), and the
scripts they reuse, each still runnable as ``python -m benchmarks.<name>``."""
