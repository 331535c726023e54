"""vLLM general plugin: install the capture hooks right after the model loads,
before vLLM compiles it (torch.compile / CUDA graphs trace only the hooks that
exist at trace time).

Contract: registered as the ``vllm.general_plugins`` entry point
``vllm_parity`` (pyproject.toml); vLLM calls :func:`register` in every process
it starts, workers included.  It does nothing unless the environment variable
``VLLM_PARITY_READS`` names a JSON file holding the ``[module, read]`` list:
then ``Worker.load_model`` is wrapped to call ``CaptureExtension.vp_install``
on the freshly loaded model, and the capture op joins vLLM's graph-splitting
ops (harness.engines.vllm_compat).  An environment variable, not a module global,
because tensor-parallel workers are separate processes.  Any other vLLM engine
in the same environment is untouched (the variable is unset there).

Test-only: where ``VLLM_PARITY_FAULT`` (harness.engines.engine_faults.ENV) is
set, a planted engine bug is applied to the loaded model before vLLM's weight
post-processing (harness.engines.engine_faults.install), with or without reads.
"""
from __future__ import annotations

import json
import os

ENV = "VLLM_PARITY_READS"
_patched = False


def register() -> None:
    global _patched
    from harness.engines.engine_faults import ENV as FAULT_ENV

    if os.environ.get(FAULT_ENV):  # a planted bug (tests only): before the reads' early return
        from harness.engines.engine_faults import install

        install()
    if _patched or not os.environ.get(ENV):
        return
    from harness.engines.vllm_compat import add_splitting_op, worker_class

    # the capture op runs outside CUDA graphs, between replays (harness.engines.vllm_worker)
    add_splitting_op()
    Worker = worker_class()  # noqa: N806 -- every device's worker inherits its load_model
    original = Worker.load_model

    def load_model(self, *args, **kwargs):
        original(self, *args, **kwargs)
        path = os.environ.get(ENV)
        if path and hasattr(self, "vp_install"):
            with open(path) as f:
                # off until the harness's own requests: vLLM's boot forwards (memory profiling over
                # max_num_batched_tokens dummy tokens, warm-up, graph capture) are not compared, and
                # recording them ran the 8B-shaped model in fp32 out of an H200's 140 GB
                self._vp_missing = self.vp_install(json.load(f), enabled=False)

    Worker.load_model = load_model
    _patched = True
