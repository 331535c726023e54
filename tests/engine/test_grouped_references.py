"""The reference forwards that write spilled captures a few layers at a time
(harness.references.reference._run_cache), on the real TransformerBridge: the same values as one
forward holding everything, bitwise.  The spill store itself is tests/unit/test_spill.py's."""
from __future__ import annotations

import pytest
import torch

from harness.spill import SpilledTensors

pytestmark = pytest.mark.parity


def test_grouped_reference_forwards_capture_what_one_forward_does(tmp_path, monkeypatch):
    """The real TransformerBridge on a synthetic checkpoint: every hook, one forward holding all of
    them vs one layer per forward (the smallest spill budget), compared bitwise; compatibility mode too."""
    from harness.models.families import FAMILIES
    from harness.models.targets import target_for_family
    from harness.references import reference
    from harness.references.reference import _boot_bridge, _run_cache
    from harness.comparison.shapes import reference_to_canonical

    target = target_for_family(FAMILIES["qwen3"])
    bridge = _boot_bridge(target.checkpoint, torch.float32, "cpu")
    tokens = [1, 5, 9, 2, 7, 3, 11]
    names = {n for n in bridge.hook_dict if n.startswith(("blocks.", "embed.", "ln_final.", "unembed."))}
    for mode in ("canonical", "compat"):
        if mode == "compat":
            bridge.enable_compatibility_mode(no_processing=True)
            names = {n for n in bridge.hook_dict if n.startswith(("blocks.", "hook_", "ln_final."))}
        with torch.no_grad():
            _, cache = bridge.run_with_cache(torch.tensor([tokens]), names_filter=lambda n: n in names)
        whole = {n: reference_to_canonical(n, cache[n]) for n in names if n in cache}
        monkeypatch.setattr(reference, "SPILL_GROUP_BYTES", 1)  # one layer per forward
        spilled = SpilledTensors(tmp_path / mode)
        _run_cache(bridge, tokens, names, "cpu", spilled)
        assert set(spilled) == set(whole) and len(whole) > 20, mode
        differ = [n for n in whole if not torch.equal(spilled[n], whole[n].contiguous())]
        assert not differ, f"{mode}: grouped forwards changed {differ[:5]}"
