"""Bad input fails at once with a message naming the input and the fix."""
import subprocess
import sys

from harness.paths import REPO_ROOT as REPO


def _pytest(*args):
    return subprocess.run([sys.executable, "-m", "pytest", "parity_tests", "--collect-only", "-q", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=300)


def test_unknown_family_fails_with_known_list():
    p = _pytest("--model", "qwen3,nosuch")
    assert p.returncode != 0
    assert "nosuch" in p.stderr and "known families" in p.stderr and "gemma" in p.stderr


def test_missing_model_path(tmp_path):
    p = _pytest("--model-path", str(tmp_path / "absent"))
    assert p.returncode != 0 and "no such directory" in p.stderr


def test_model_path_without_overlay(tmp_path):
    (tmp_path / "config.json").write_text('{"architectures": ["DeepseekV4ForCausalLM"]}')  # DeepSeek-V4: no overlay
    p = _pytest("--model-path", str(tmp_path))
    assert p.returncode != 0 and "DeepseekV4ForCausalLM" in p.stderr and "overlays/__init__.py" in p.stderr


def test_collection_one_item_per_model_reference_hook():
    p = _pytest("--model", "qwen3")
    assert p.returncode == 0, p.stderr
    ids = [line for line in p.stdout.splitlines() if "::" in line]
    assert any(i.endswith("test_parity[qwen3-bridge-ln_final.hook_normalized]") for i in ids)
    assert any(i.endswith("test_parity[qwen3-compat-blocks.2.hook_out]") for i in ids)
    assert any(i.endswith("test_parity[qwen3-hf-logprobs]") for i in ids)
    assert not any("gemma" in i for i in ids)


def test_model_path_runs_a_local_checkpoint():
    from harness.models.checkpoints import checkpoint_dir
    from harness.models.families import FAMILIES

    ckpt = checkpoint_dir(FAMILIES["llama"])
    p = _pytest("--model-path", str(ckpt))
    assert p.returncode == 0, p.stderr
    assert f"test_parity[{ckpt.name}-bridge-blocks.0.hook_out]" in p.stdout


def test_cli_unknown_family_exit_code():
    p = subprocess.run([sys.executable, "-m", "harness", "run", "--model", "nosuch"], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "known families" in p.stderr


def test_lines_refuses_several_dtypes_before_running_a_line(tmp_path):
    """A grid is one dtype: `harness lines --dtype float32,bfloat16` used to run the line, then fail reading it."""
    p = subprocess.run([sys.executable, "-m", "harness", "lines", "--lines", "0.20.2", "--model", "llama",
                        "--dtype", "float32,bfloat16", "--out", str(tmp_path)], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "once per dtype" in p.stderr and not (tmp_path / "vllm-0.20.2.log").exists()
