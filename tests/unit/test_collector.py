"""harness.collector: what is alive at the freeze is never walked again; what is made after it is collected as
before.  In a child process, so this pytest process's own heap (frozen by the plugin) is not touched."""
from __future__ import annotations

import subprocess
import sys

from harness.paths import REPO_ROOT

CHILD = r"""
import gc, sys, weakref
from harness.collector import freeze_long_lived

class Node:
    pass

def cycle():
    a, b = Node(), Node()
    a.other, b.other = b, a
    return weakref.ref(a)

before = cycle()                     # garbage made before the freeze: collected by it, never frozen
assert "colorsys" not in sys.modules
n = freeze_long_lived("colorsys", "no_such_module_anywhere")
assert before() is None, "the freeze's own collection left a cycle made before it"
assert "colorsys" in sys.modules, "an import the caller asked for was not made"
assert n == gc.get_freeze_count() > 1000, n
alive = Node(); alive.me = alive
gc.collect()
after = cycle()                      # garbage made after the freeze: collected as before
gc.collect()
assert after() is None, "a cycle made after the freeze was not collected"
assert freeze_long_lived() >= n      # a second call freezes what was made since, no fewer
print("ok")
"""


def test_the_freeze_keeps_what_is_alive_and_collects_what_is_made_after():
    out = subprocess.run([sys.executable, "-c", CHILD], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stdout + out.stderr
