"""Declared refusals (harness.pipeline.refusals): the rows are data, and the re-check is strict.

Engine-free: the declarations' shape, which devices a refusal covers, and how the parity suite
turns a refused family into one test (the re-checks themselves boot vLLM or probe its ops, and
run in the parity suite: ``pytest parity_tests --model t5,mamba,jamba``).
"""
from __future__ import annotations

import pytest

from harness.models.families import FAMILIES, Refusal
from harness.values.variant import Variant


def test_a_refusal_names_its_probe():
    with pytest.raises(ValueError, match="op:<name"):
        Refusal("why", probe="crash")
    with pytest.raises(ValueError, match="op:<name"):
        Refusal("why", probe="op:")
    assert Refusal("why", probe="op:selective_scan_fwd").devices == ("cpu", "cuda")


def test_the_refused_rows_say_why_and_are_checked_before_a_crash():
    refused = {n: s.refusal_on("cpu") for n, s in FAMILIES.items() if s.refusal_on("cpu") is not None}
    assert {"t5", "mamba", "jamba"} <= set(refused)
    assert all(r.reason for s in FAMILIES.values() for r in s.refusals)
    # Mamba-1 mixers load and then crash on CPU: an op probe, never a boot; on CUDA they run
    assert refused["mamba"].probe == refused["jamba"].probe == "op:selective_scan_fwd"
    assert refused["mamba"].devices == refused["jamba"].devices == ("cpu",)
    t5_cuda = FAMILIES["t5"].refusal_on("cuda")
    assert refused["t5"].probe == t5_cuda.probe == "boot" and refused["t5"].reason == t5_cuda.reason
    assert refused["t5"].says == "Argument position_ids not found in the forward method of" and not t5_cuda.says
    # every boot refusal of the CPU line pins vLLM's words (measured there), so another failure is never a skip
    assert all(r.says for r in refused.values() if r.probe == "boot"), [n for n, r in refused.items()
                                                                        if r.probe == "boot" and not r.says]
    assert FAMILIES["t5"].auto_class == "AutoModelForSeq2SeqLM"


def test_a_refusal_applies_on_its_devices_only_and_the_plan_says_there_is_no_overlay():
    from harness.models.targets import target_for_family
    from harness.values.plan import build_plan
    from harness.pipeline.refusals import applies
    from overlays import NoOverlayError

    from dataclasses import replace

    dsa = target_for_family(FAMILIES["glm_moe_dsa"])  # GLM-5: refused on CPU, its overlay for CUDA
    assert dsa.overlay is not None and dsa.architecture == "GlmMoeDsaForCausalLM"
    assert applies(dsa, Variant()) and not applies(dsa, Variant(device="cuda"))
    bare = replace(dsa, overlay=None)  # an architecture refused on the CPU with no overlay for the device it runs on
    with pytest.raises(NoOverlayError, match="declared refused on cpu only, and runs on cuda"):
        build_plan(bare, Variant(device="cuda"))
    # Mamba-1, Jamba and GLM-5 have their overlays (overlays/mamba.py, jamba.py, glm_moe_dsa.py): refused on CPU,
    # planned on CUDA
    for name in ("mamba", "jamba", "glm_moe_dsa"):
        t = target_for_family(FAMILIES[name])
        assert t.overlay is not None and applies(t, Variant()) and not applies(t, Variant(device="cuda"))
        assert build_plan(t, Variant(device="cuda")).cases
    assert not applies(target_for_family(FAMILIES["qwen3"]), Variant())


def test_an_import_probe_names_a_module():
    from harness.models.families import FAMILIES, Refusal

    assert Refusal("x", probe="import:vllm.model_executor.models.qwen3_5").probe.endswith("qwen3_5")
    with pytest.raises(ValueError, match="import:<vLLM model module"):
        Refusal("x", probe="import:")
    # Qwen3.5's vLLM module imports torchvision, which the CPU venv lacks: checked by importing, not by a boot
    assert FAMILIES["qwen3_5"].refusal_on("cpu").probe == FAMILIES["qwen3_5_moe"].refusal_on("cpu").probe == \
        "import:vllm.model_executor.models.qwen3_5"


def test_a_row_declares_one_refusal_per_device_and_a_run_asks_for_its_devices():
    from harness.models.families import ModelSpec

    cpu, cuda = Refusal("cpu's words", probe="import:vllm.x", devices=("cpu",)), Refusal("cuda's", devices=("cuda",))
    spec = ModelSpec("x", "llama", refused=(cpu, cuda))
    assert spec.refusal_on("cpu") is cpu and spec.refusal_on("cuda") is cuda and spec.refusals == (cpu, cuda)
    assert spec.refused_devices == ("cpu", "cuda")
    # one Refusal, as every row declared before, covers the devices it names and no other
    both, cpu_only = ModelSpec("x", "llama", refused=Refusal("why")), ModelSpec("x", "llama", refused=cpu)
    assert both.refusal_on("cpu") is both.refusal_on("cuda") is both.refused
    assert cpu_only.refusal_on("cpu") is cpu and cpu_only.refusal_on("cuda") is None and cpu_only.refusals == (cpu,)
    assert ModelSpec("x", "llama").refusal_on("cuda") is None and ModelSpec("x", "llama").refusals == ()
    with pytest.raises(ValueError, match="resolve 'auto' first"):
        spec.refusal_on("auto")
    with pytest.raises(ValueError, match="named by two Refusals"):
        ModelSpec("x", "llama", refused=(cpu, Refusal("again")))
    with pytest.raises(ValueError, match="a Refusal or a tuple of them"):
        ModelSpec("x", "llama", refused=(cpu, "cuda's words"))
    hf = Refusal("remote code", probe="hf:x", devices=("cpu",), vllm_registry=("native", "x.X"))
    for refused in ((hf, cuda), hf):  # an 'hf:' probe: no checkpoint can be built for any device
        with pytest.raises(ValueError, match="only Refusal and covers every device"):
            ModelSpec("x", "x", refused=refused, released_architecture="XForCausalLM")


def test_a_refusal_names_real_devices_and_pins_words_only_for_a_boot():
    with pytest.raises(ValueError, match="Refusal.devices"):
        Refusal("why", devices=("tpu",))
    with pytest.raises(ValueError, match="Refusal.devices"):
        Refusal("why", devices=())
    with pytest.raises(ValueError, match="no boot"):
        Refusal("why", probe="op:selective_scan_fwd", says="selective_scan_fwd")
    assert Refusal("why", devices=["cuda"]).devices == ("cuda",)  # a list (JSON) comes back a tuple


def test_the_cuda_line_refusals_leave_the_cpu_rows_as_they_were():
    """vLLM 0.20.2 (CUDA) refuses granitemoehybrid, qwen3_5 and qwen3_5_moe at boot, in its own words (the H200 run
    of docs/gpu/evidence/hybrids-2026-12-04); granitemoehybrid runs on the CPU line, the Qwen3.5 rows keep their CPU
    import probe."""
    granite = FAMILIES["granitemoehybrid"]
    assert granite.refusal_on("cpu") is None and granite.builds_checkpoint and granite.norm_weight_offset == 0.0
    refusal = granite.refusal_on("cuda")
    assert (refusal.probe, refusal.devices, refusal.says) == ("boot", ("cuda",), "KeyError: 'linear_attention'")
    assert refusal.says in refusal.reason and "0.20.2" in refusal.reason
    for name in ("qwen3_5", "qwen3_5_moe"):
        spec = FAMILIES[name]
        assert spec.refusal_on("cpu").probe == "import:vllm.model_executor.models.qwen3_5"
        assert spec.refusal_on("cuda").probe == "boot" and "0.20.2" in spec.refusal_on("cuda").reason
        # refused on every device: never compared, so its checkpoint is built as before (no norm offset)
        assert spec.norm_weight_offset == 0.0 and spec.builds_checkpoint
    # hrm_text: refused on CUDA only, as before
    assert FAMILIES["hrm_text"].refusal_on("cpu") is None and FAMILIES["hrm_text"].refusal_on("cuda").probe == "boot"


def test_the_runner_asks_for_the_refusal_of_the_runs_device():
    from harness.models.targets import target_for_family
    from harness.pipeline.refusals import applies, declared_dtype_refusal

    granite = target_for_family(FAMILIES["granitemoehybrid"])
    assert granite.overlay is not None and granite.refusal_on("cpu") is None
    assert not applies(granite, Variant()) and applies(granite, Variant(device="cuda"))
    assert declared_dtype_refusal(granite, Variant()) is None
    qwen35 = target_for_family(FAMILIES["qwen3_5"])
    assert applies(qwen35, Variant()) and applies(qwen35, Variant(device="cuda"))
    assert qwen35.refusal_on("cpu") is not qwen35.refusal_on("cuda")
    # GLM-5, refused on the CPU only: on CUDA its MLA backend's fp32 refusal is the run's declaration
    dsa = target_for_family(FAMILIES["glm_moe_dsa"])
    assert declared_dtype_refusal(dsa, Variant()) is None
    assert "no fp32 MLA attention backend" in declared_dtype_refusal(dsa, Variant(device="cuda")).reason
    # Qwen3-Next's fp32: refused on both lines, in each line's own words
    gdn = target_for_family(FAMILIES["qwen3_next"])
    assert declared_dtype_refusal(gdn, Variant()).says == "CPU GDN attention requires BF16."
    assert "ChunkGatedDeltaRuleFunction" in declared_dtype_refusal(gdn, Variant(device="cuda")).says
    assert declared_dtype_refusal(gdn, Variant(dtype="float16", device="cuda")) is None  # not measured there: it runs


def _boot_failing_with(monkeypatch, said: str | None):
    """refusals.capture_vllm raising what a failed boot raises (its first line, the launcher's tail), or booting."""
    import harness.pipeline.refusals as refusals
    from harness.engines.subject import SubjectError

    def capture(*a, **k):
        if said is not None:
            raise SubjectError(f"{said} -- harness.engines.subject_vllm exited with 1 (log: /x/subject.log):\nTraceback")
    monkeypatch.setattr(refusals, "capture_vllm", capture)


@pytest.mark.parametrize("said, verdict", [
    ("KeyError: 'linear_attention'", "skipped"),  # vLLM 0.20.2's words: still refused
    ("RuntimeError: CUDA out of memory", "error"),  # another failure: not the declared refusal
    (None, "error"),  # it booted: the declaration is stale
])
def test_a_boot_refusal_with_words_is_rechecked_by_them(monkeypatch, tmp_path, said, verdict):
    from harness.models.targets import target_for_family
    from harness.pipeline.refusals import recheck_architecture
    from harness.values.results import ModelResult

    _boot_failing_with(monkeypatch, said)
    target, variant = target_for_family(FAMILIES["granitemoehybrid"]), Variant(dtype="bfloat16", device="cuda")
    result = ModelResult(target.name, target.architecture, target.overlay_name, "synthetic", str(target.checkpoint),
                         variant.dtype, target.seed, device=variant.device)
    recheck_architecture(target, variant, result, tmp_path)
    if verdict == "skipped":
        assert not result.error and "on cuda" in result.skipped and "KeyError: 'linear_attention'" in result.skipped
        assert " -- harness" not in result.skipped
    else:
        assert not result.skipped and "no longer hold" in result.error
        assert ("without \"KeyError: 'linear_attention'\"" in result.error) == (said is not None)


def test_a_checkpoint_by_path_carries_its_architectures_dtype_refusals():
    from harness.models.families import dtype_refusals_of_architecture

    from harness.models.families import refusal_on

    gdn = dtype_refusals_of_architecture(FAMILIES["qwen3_next"].architecture)
    assert set(gdn) == {"float32", "float16"} and gdn["float32"][0] == "qwen3_next"
    assert "CPU GDN attention requires BF16" in refusal_on(gdn["float32"][1], "cpu").says
    assert dtype_refusals_of_architecture("LlamaForCausalLM") == {}


@pytest.mark.parametrize("said, verdict", [
    ("AssertionError: CPU GDN attention requires BF16.", "skipped"),
    (None, "runs"),  # this checkpoint boots in that dtype: no refusal, its run goes on
    # another failure of the user's config in that dtype: not the row's refusal, never a skip
    ("RuntimeError: chunk_gated_delta_rule_cpu: expect head_dim to be equal to head_dim_v", "error"),
])
def test_a_checkpoint_by_paths_inherited_dtype_refusal_is_rechecked_by_booting_it(monkeypatch, tmp_path, said,
                                                                                  verdict):
    from dataclasses import replace

    from harness.models.families import dtype_refusals_of_architecture
    from harness.models.targets import target_for_family
    from harness.pipeline.refusals import candidate_dtype_refusal, recheck_candidate_dtype
    from harness.values.results import ModelResult

    _boot_failing_with(monkeypatch, said)
    family = target_for_family(FAMILIES["qwen3_next"])
    target = replace(family, name="mine", source="path", unsupported_dtypes={},
                     candidate_dtype_refusals=dtype_refusals_of_architecture(family.architecture))
    variant = Variant(dtype="float32")
    assert candidate_dtype_refusal(target, variant)[0] == "qwen3_next"
    assert candidate_dtype_refusal(target, Variant(dtype="bfloat16")) is None
    result = ModelResult(target.name, target.architecture, target.overlay_name, "path", str(target.checkpoint),
                         variant.dtype, target.seed, device=variant.device)
    done = recheck_candidate_dtype(target, variant, result, tmp_path)
    if verdict == "error":
        assert done and not result.skipped and "words no longer hold" in result.error
        assert "'CPU GDN attention requires BF16.'" in result.error and "'qwen3_next'" in result.error
        return
    assert not result.error
    if verdict == "skipped":
        assert done and "CPU GDN attention requires BF16" in result.skipped and "'qwen3_next'" in result.skipped
    else:
        assert not done and not result.skipped


def _rechecked_dtype(monkeypatch, tmp_path, family: str, dtype: str, said):
    """The result of re-checking ``family``'s declared ``dtype`` refusal where the boot fails saying ``said``."""
    from harness.models.targets import target_for_family
    from harness.pipeline.refusals import recheck_dtype
    from harness.values.results import ModelResult

    _boot_failing_with(monkeypatch, said)
    target, variant = target_for_family(FAMILIES[family]), Variant(dtype=dtype)
    result = ModelResult(target.name, target.architecture, target.overlay_name, "synthetic", str(target.checkpoint),
                         variant.dtype, target.seed, device=variant.device)
    recheck_dtype(target, variant, result, tmp_path)
    return result


@pytest.mark.parametrize("said, verdict", [
    ("ValueError: The model type 'glm4' does not support float16. Reason: Numerical instability. Please use "
     "bfloat16 or float32 instead.", "skipped"),
    ("RuntimeError: CUDA out of memory", "error"),  # another failure: not the declared refusal
    (None, "error"),  # it booted: the declaration is stale
])
def test_a_rows_dtype_refusal_is_rechecked_by_its_words(monkeypatch, tmp_path, said, verdict):
    result = _rechecked_dtype(monkeypatch, tmp_path, "glm4", "float16", said)
    if verdict == "skipped":
        assert not result.error and "Numerical instability" in result.skipped and " -- harness" not in result.skipped
    else:
        assert not result.skipped and "no longer hold" in result.error


def test_a_dtype_refusal_is_a_boot_refusal_named_once_per_device():
    from dataclasses import replace

    from harness.models.families import Refusal

    spec = FAMILIES["qwen3_next"]
    with pytest.raises(ValueError, match="unsupported_dtypes"):
        replace(spec, unsupported_dtypes={"float32": "a bare string pins no device and no words"})
    with pytest.raises(ValueError, match="'boot' probe"):
        replace(spec, unsupported_dtypes={"float32": Refusal("no such op", probe="op:gdn")})
    with pytest.raises(ValueError, match="names a device twice"):
        replace(spec, unsupported_dtypes={"float32": (Refusal("a"), Refusal("b", devices=("cpu",)))})


@pytest.mark.parametrize("device, error, verdict", [
    ("cpu", "SubjectError: NotImplementedError: is_act_and_mul=False is supported only for CUDA, XPU and ROCm for now "
            "-- harness.engines.subject_vllm exited with 1", "skipped"),
    ("cpu", "SubjectError: RuntimeError: CUDA out of memory", None),  # another failure: stays the run's error
    ("cuda", "NotImplementedError: is_act_and_mul=False is supported only for CUDA, XPU and ROCm for now", None),
])
def test_a_checkpoint_by_path_meets_its_architectures_boot_refusal_in_its_words(device, error, verdict):
    """A Nemotron-H checkpoint of the user's: the nemotron_h_moe row's CPU refusal is its candidate, applied only
    where the run's own vLLM failed in its words on its device (nemotron_h itself runs: nothing is probed first)."""
    from dataclasses import replace

    from harness.models.families import refusals_of_architecture
    from harness.models.targets import target_for_family
    from harness.pipeline.refusals import refused_as_candidate

    family = target_for_family(FAMILIES["nemotron_h"])
    candidates = refusals_of_architecture(family.architecture)
    assert [f for f, _ in candidates] == ["nemotron_h_moe"]
    target = replace(family, name="mine", source="path", candidate_refusals=candidates)
    skipped = refused_as_candidate(target, Variant(device=device), error)
    if verdict is None:
        assert skipped is None
        return
    assert skipped.startswith("not run: vLLM refuses this checkpoint on cpu (SubjectError: NotImplementedError: "
                              "is_act_and_mul=False")
    assert "'nemotron_h_moe' of NemotronHForCausalLM" in skipped and " -- harness" not in skipped
    assert refused_as_candidate(family, Variant(device=device), error) is None  # a row declares its own


def test_a_checkpoint_by_path_meets_its_architectures_missing_op_by_its_name():
    """A Mamba-1 checkpoint of the user's on the CPU line: the mamba row's op refusal is its candidate, its words the
    op's name, which vLLM's own error names where its layer looks the op up."""
    from dataclasses import replace

    from harness.models.families import refusals_of_architecture
    from harness.models.targets import target_for_family
    from harness.pipeline.refusals import refused_as_candidate

    family = target_for_family(FAMILIES["mamba"])
    candidates = refusals_of_architecture(family.architecture)
    assert [(f, r.run_words) for f, r in candidates] == [("mamba", ("selective_scan_fwd",))]
    target = replace(family, name="mine", source="path", refused=None, candidate_refusals=candidates)
    error = "SubjectError: AttributeError: '_OpNamespace' '_C' object has no attribute 'selective_scan_fwd'"
    skipped = refused_as_candidate(target, Variant(device="cpu"), error)
    assert "has no attribute 'selective_scan_fwd'" in skipped and "'mamba' of MambaForCausalLM" in skipped
    assert refused_as_candidate(target, Variant(device="cuda"), error) is None  # declared for the CPU only
    assert refused_as_candidate(target, Variant(device="cpu"), "SubjectError: RuntimeError: boom") is None


def test_run_words_are_what_a_runs_own_error_can_show():
    assert Refusal("r", says="no float32").run_words == ("no float32",)
    assert Refusal("r").run_words == ()  # a boot refusal that pins no words: nothing to match
    assert Refusal("r", probe="op:selective_scan_fwd").run_words == ("selective_scan_fwd",)
    assert Refusal("r", probe="import:vllm.model_executor.models.qwen3_5").run_words == ()
    assert Refusal("r", says=("oneDNN's words", "torch's words")).run_words == ("oneDNN's words", "torch's words")
    assert Refusal("r", says=("oneDNN's words", "torch's words")).run_said_in("RuntimeError: torch's words") == \
        "torch's words"
    assert Refusal("r", probe="op:selective_scan_fwd").run_said_in("no attribute 'selective_scan_fwd'") == \
        "selective_scan_fwd"
    assert Refusal("r").run_said_in("anything") is None


@pytest.mark.parametrize("said, verdict", [
    ("RuntimeError: expected scalar type Float but found Half", "skipped"),  # oneDNN's GEMM (the AMX host)
    ("RuntimeError: expected m1 and m2 to have the same dtype, but got: float != c10::Half", "skipped"),  # torch's
    ("RuntimeError: CUDA out of memory", "error"),  # neither: another failure
])
def test_a_refusal_whose_words_differ_by_kernel_path_holds_in_either(monkeypatch, tmp_path, said, verdict):
    """apertus in float16: the same failure in oneDNN's words on an AMX CPU and in torch's elsewhere (measured on an
    AVX-512 host without AMX and under emulated AVX2): either holds the refusal, other words do not."""
    result = _rechecked_dtype(monkeypatch, tmp_path, "apertus", "float16", said)
    if verdict == "skipped":
        assert not result.error and said.split(": ", 1)[1] in result.skipped
    else:
        assert not result.skipped and "no longer hold" in result.error and " or " in result.error


def test_a_checkpoint_with_no_overlay_that_vllm_refused_at_discovery_carries_the_rows_refusal():
    """A user's GLM-5 on the CPU line has no overlay there, and the boot that looks up its module tree fails in the
    glm_moe_dsa row's words: the target carries that refusal (its runs re-check it), where it was an error that
    stopped every other target of the command; other words are no refusal."""
    from harness.models.targets import _refused_at_discovery

    said = ("GlmMoeDsaForCausalLM has no declared overlay, and vLLM could not boot the checkpoint to discover its "
            "module tree: NotImplementedError: Sparse Attention is not supported on CPU. -- harness.engines...")
    refused = _refused_at_discovery("GlmMoeDsaForCausalLM", said)
    assert refused.devices == ("cpu",) and refused.says == "Sparse Attention is not supported on CPU"
    assert "declared by the family row 'glm_moe_dsa'" in refused.reason
    assert _refused_at_discovery("GlmMoeDsaForCausalLM", "RuntimeError: out of memory") is None
    assert _refused_at_discovery("LlamaForCausalLM", said) is None  # no row of that architecture declares it
