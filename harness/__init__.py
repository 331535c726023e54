"""vllm-parity's harness.  Importing it applies a test-only kernel-path emulation where
``VLLM_PARITY_EMULATE_ISA`` asks for one (harness.kernel_path); otherwise it does nothing."""
import os as _os

if _os.environ.get("VLLM_PARITY_EMULATE_ISA"):
    from harness.kernel_path import apply_emulation as _apply_emulation

    _apply_emulation()
