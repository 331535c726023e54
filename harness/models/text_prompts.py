"""Natural-language prompts: the default set, a ``--prompts FILE``, and their tokenization.

Contract: :func:`prompt_set(target, prompts)` returns a :class:`PromptSet` -- a
``{name: token ids}`` dict (what every engine runs, ``harness.pipeline.runner.prompts_for``)
whose ``info`` says where the prompts came from and, for text, each prompt's text, its
tokens decoded one by one (the report shows the text around a worst position) and
every note (truncation, a trimmed token).  Which prompts:

* ``prompts`` given (a :class:`PromptsFile`, from ``--prompts FILE``): its texts,
  tokenized with the checkpoint's own tokenizer;
* else a checkpoint with a real tokenizer (the packaged ``smollm2``, or a
  ``--model-path`` whose tokenizer is not a WordLevel toy): :data:`DEFAULT_TEXT_PROMPTS`;
* else (a synthetic checkpoint): the token-id prompts of ``harness.models.prompts``.

:func:`parse_prompts_option` reads a file (argparse ``type``: bad input stops both front
ends at parse time); :func:`with_prompts` attaches it to targets after checking that
every one has a real tokenizer and that every prompt tokenizes (so an error comes
before any engine boots).

Tokenization: plain text is ``tokenizer(text)``, then ``bos_token_id`` prepended iff the
model has one (``config.bos_token_id``) and the tokenizer did not already put it first
(TransformerLens's ``prepend_bos`` default, and what the token-id prompts do).
SmolLM2's tokenizer does not add it (its GGUF says ``add_bos_token: false``), and its
BOS is ``<|im_start|>`` (id 1), so its text prompts start with id 1 like its token-id
prompts did.  ``chat: true`` renders the checkpoint's own chat template around one user
message (``add_generation_prompt=True``); the template writes its own start tokens, so
nothing is prepended.  A prompt longer than ``max_model_len - 8`` is cut to it (noted,
unless the prompt is declared to fill the budget).

Prompts are run as given: equal lengths and duplicates are fine (the ragged-batch run matches
vLLM's requests to prompts by request id, harness.engines.subject.SubjectCapture.ragged_read).
The one cut is the ``max_model_len`` budget above, and its note says so.

Degenerate tokenizations (:func:`degenerate`): a tokenizer that is not a WordLevel toy can still
make the default text prompts test little -- mostly unknown tokens, a prompt of one token, every
prompt the same.  The default prompts then fall back to the token-id prompts, with a note in the
report; a ``--prompts`` file that tokenizes so is refused, naming the file and the fix.

Synthetic checkpoints and ``--prompts``: their tokenizer is a WordLevel toy
(``<pad> <s> </s> <unk> t4 ... t511``) under which every word of a text is ``<unk>``,
so a text prompt there would be one token repeated: :func:`with_prompts` refuses it
and names the fix, rather than run something else than what was asked.
"""
from __future__ import annotations

import argparse
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

MARGIN = 8  # prompts fit max_model_len - MARGIN tokens (as the token-id prompts do)
FILE_FORMS = ('a text file (one prompt per non-empty line) or a .jsonl file (one object per line: '
              '{"text": "...", "chat": true, "name": "..."}; "chat" and "name" optional)')
DEFAULT_SOURCE = "default text prompts (harness/models/text_prompts.py)"
TOKEN_ID_SOURCE = "token ids (harness/models/prompts.py)"


class PromptsError(ValueError):
    """Bad ``--prompts`` input, or prompts a target cannot run: names the input and the fix."""


@dataclass(frozen=True)
class TextPrompt:
    name: str
    text: str
    chat: bool = False  # wrap in the checkpoint's chat template (one user message, generation prompt)
    fill: bool = False  # meant to exceed the length budget: cut to it without a note
    where: str = ""  # where it was declared (file and line), for messages


# Declared as data.  Lengths with SmolLM2's tokenizer, BOS included (max_model_len 256): prose 16,
# code 20, repeated 25, long 248 (its text is 288 tokens, cut to the budget): 309 tokens in all, as
# the token-id prompts' 300 (7, 16, 29, 248), so a run costs what it did.
DEFAULT_TEXT_PROMPTS: tuple[TextPrompt, ...] = (
    TextPrompt("prose", "The capital of France is Paris, and the capital of Italy is Rome."),
    TextPrompt("code", "def square(x):\n    return x * x\n\nprint(square(12))"),
    # an arbitrary sentence twice: the second copy is predictable only by copying the first (induction)
    TextPrompt("repeated", " ".join(["Violet kites drift above seven quiet harbors at noon."] * 2)),
    TextPrompt("long", fill=True, text=(
        "Lighthouses were once the most important buildings on a dangerous coast. Before electric lamps, a "
        "keeper climbed the tower every evening to trim the wicks, polish the glass and wind the clockwork "
        "that turned the lens. The light had to burn from sunset to sunrise, and a keeper who let it fail "
        "could lose his post. Early towers burned wood or coal in open braziers, which smoked and were hard "
        "to see in rain. Oil lamps with reflectors were brighter, and in 1822 Augustin Fresnel designed a lens "
        "of concentric glass rings that gathered almost all the light into a single beam. A Fresnel lens could "
        "be seen more than twenty miles out to sea. Each lighthouse was given its own pattern of flashes, so "
        "that a sailor who counted the seconds between them knew which headland he was looking at. By day the "
        "towers were painted with stripes, bands or checks for the same reason. Keepers and their families "
        "often lived on bare rocks for months at a time, with supplies brought by boat when the weather "
        "allowed. They kept logbooks of the wind, the sea and every ship that passed, and many of those books "
        "survive in archives today. In the twentieth century most lights were automated, and the keepers left. "
        "Satellite navigation has since made many of them unnecessary, but a good number still shine, and "
        "some old keepers' cottages now welcome visitors who want to sleep beside the sea."
    )),
)


@dataclass(frozen=True)
class PromptsFile:
    """A parsed ``--prompts`` file: its path, prompts and content digest (``--resume`` fingerprints it)."""

    path: Path
    prompts: tuple[TextPrompt, ...]
    sha256: str

    def __str__(self) -> str:
        return str(self.path)


def parse_prompts_text(text: str, source: str, jsonl: bool | None = None) -> tuple[TextPrompt, ...]:
    """Prompts from a file's text.  ``jsonl``: None decides from the first non-empty line (a JSON
    object with a "text" key makes it JSONL, as does a ``.jsonl`` suffix in :func:`read_prompts_file`)."""
    lines = [(n, line.strip()) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not lines:
        raise PromptsError(f"--prompts {source}: no prompt in it (every line is empty); write {FILE_FORMS}")
    if jsonl is None:
        jsonl = _looks_like_jsonl(lines[0][1])
    prompts = [_json_prompt(n, line, source) if jsonl else
               TextPrompt(f"p{n}", line, where=f"--prompts {source} line {n}") for n, line in lines]
    seen: dict[str, str] = {}
    for p in prompts:
        if p.name in seen:
            raise PromptsError(f"{p.where}: name {p.name!r} already used ({seen[p.name]}); give each prompt "
                               "its own name")
        seen[p.name] = p.where
    return tuple(prompts)


def _looks_like_jsonl(first: str) -> bool:
    if not first.startswith("{"):
        return False
    try:
        obj = json.loads(first)
    except ValueError:
        return False
    return isinstance(obj, dict) and "text" in obj


_KEYS = {"text", "chat", "name"}


def _json_prompt(n: int, line: str, source: str) -> TextPrompt:
    where = f"--prompts {source} line {n}"
    try:
        obj = json.loads(line)
    except ValueError as exc:
        raise PromptsError(f"{where}: not valid JSON ({exc}); in a .jsonl file each line is one object, "
                           '{"text": "...", "chat": true, "name": "..."}') from None
    if not isinstance(obj, dict):
        raise PromptsError(f"{where}: a JSON {type(obj).__name__}, not an object; write "
                           '{"text": "...", "chat": true, "name": "..."}')
    unknown = sorted(set(obj) - _KEYS)
    if unknown:
        raise PromptsError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; the keys are "
                           '"text" (required), "chat" (true/false) and "name"')
    text = obj.get("text")
    if not isinstance(text, str) or not text.strip():
        raise PromptsError(f'{where}: "text" must be a non-empty string (got {text!r})')
    chat = obj.get("chat", False)
    if not isinstance(chat, bool):
        raise PromptsError(f'{where}: "chat" must be true or false (got {chat!r})')
    name = obj.get("name", f"p{n}")
    if not isinstance(name, str) or not name.strip() or "|" in name or "\n" in name:
        raise PromptsError(f'{where}: "name" must be a non-empty one-line string without "|" (got {name!r})')
    return TextPrompt(name.strip(), text, chat=chat, where=where)


def read_prompts_file(path: str | Path) -> PromptsFile:
    p = Path(path).expanduser()
    if not p.is_file():
        what = "a directory" if p.is_dir() else "no such file"
        raise PromptsError(f"--prompts {path}: {what}; pass {FILE_FORMS}")
    raw = p.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PromptsError(f"--prompts {path}: not UTF-8 text ({exc}); save it as UTF-8") from None
    jsonl = True if p.suffix.lower() in (".jsonl", ".ndjson") else None
    prompts = parse_prompts_text(text, str(path), jsonl)
    return PromptsFile(p.resolve(), prompts, hashlib.sha256(raw).hexdigest())


def parse_prompts_option(text: str) -> PromptsFile:
    """argparse ``type`` of ``--prompts``: the parsed file, or a usage error naming the input and the fix."""
    try:
        return read_prompts_file(text)
    except PromptsError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


# -- tokenizers ---------------------------------------------------------------------------------


@lru_cache(maxsize=8)
def _load_tokenizer(checkpoint: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(checkpoint, local_files_only=True)


def tokenizer_problem(target: Any) -> str:
    """Why ``target`` has no real tokenizer ("" when it has one): a synthetic checkpoint, no
    tokenizer in the directory, or a WordLevel toy."""
    if target.source == "synthetic":
        return "a synthetic checkpoint: its tokenizer is a WordLevel toy (<pad> <s> </s> <unk> t4 ...)"
    try:
        tok = _load_tokenizer(str(target.checkpoint))
    except Exception as exc:  # noqa: BLE001 -- any loader failure means: no usable tokenizer
        return f"no tokenizer loads from {target.checkpoint} ({type(exc).__name__}: {str(exc)[:200]})"
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is not None and type(backend.model).__name__ == "WordLevel":
        return f"its tokenizer ({target.checkpoint}) is a WordLevel toy, not a trained one"
    return ""


def tokenizer_for(target: Any) -> Any:
    return _load_tokenizer(str(target.checkpoint))


# -- tokenization ---------------------------------------------------------------------------------


class PromptSet(dict):
    """``{name: token ids}`` plus ``info``: source, texts, chat flags, decoded tokens, notes."""

    info: dict

    def __init__(self, prompts: Mapping[str, list[int]], info: dict | None = None) -> None:
        super().__init__(prompts)
        self.info = dict(info or {})


def _chat_ids(tok: Any, p: TextPrompt, checkpoint: Any) -> list[int]:
    if not getattr(tok, "chat_template", None):
        raise PromptsError(f'{p.where or p.name}: "chat": true, but the tokenizer of {checkpoint} has no chat '
                           'template; drop "chat" (plain text) or use a checkpoint that has one')
    out = tok.apply_chat_template([{"role": "user", "content": p.text}], tokenize=True, add_generation_prompt=True)
    ids = out["input_ids"] if isinstance(out, Mapping) or hasattr(out, "keys") else out
    ids = list(ids)
    if ids and isinstance(ids[0], list):  # a batch of one
        ids = ids[0]
    return [int(i) for i in ids]


def tokenize_prompts(tok: Any, prompts: tuple[TextPrompt, ...] | list[TextPrompt], bos_token_id: int | None,
                     max_model_len: int, source: str, checkpoint: Any = "the checkpoint") -> PromptSet:
    """Token ids for each prompt (BOS, chat template and the ``max_model_len`` cut as the module
    docstring says), and the ``info`` the report shows."""
    budget = max(max_model_len - MARGIN, 1)
    named: dict[str, list[int]] = {}
    texts, chats, pieces, notes = [], [], [], []
    for p in prompts:
        label = p.where or p.name
        if p.chat:
            ids = _chat_ids(tok, p, checkpoint)
        else:
            ids = [int(i) for i in tok(p.text, add_special_tokens=True)["input_ids"]]
            if bos_token_id is not None and (not ids or ids[0] != bos_token_id):
                ids = [int(bos_token_id)] + ids
        if not ids:
            raise PromptsError(f"{label}: tokenizes to no token; give it some text")
        if len(ids) > budget:
            if not p.fill:
                notes.append(f"{p.name}: {len(ids)} tokens cut to {budget} (max_model_len {max_model_len} "
                             f"- {MARGIN})")
            ids = ids[:budget]
        named[p.name] = ids
        texts.append(p.text)
        chats.append(p.chat)
        pieces.append([tok.decode([i]) for i in ids])
    return PromptSet(named, {"source": source, "texts": texts, "chat": chats, "pieces": pieces, "notes": notes})


MIN_TOKENS = 3  # a prompt of BOS and one token tests nothing past the first position
MAX_UNKNOWN = 0.5  # a set whose tokens are mostly the unknown token runs one embedding row


def degenerate(named: Mapping[str, list[int]], unk_token_id: int | None) -> str:
    """Why these tokenized prompts would test little ("" when they do not): mostly unknown tokens,
    a prompt of fewer than :data:`MIN_TOKENS` tokens, or every prompt the same."""
    every = [t for ids in named.values() for t in ids]
    short = [n for n, ids in named.items() if len(ids) < MIN_TOKENS]
    if short:
        return f"{', '.join(short)} tokenize{'s' if len(short) == 1 else ''} to fewer than {MIN_TOKENS} tokens"
    if unk_token_id is not None and every and sum(t == unk_token_id for t in every) > MAX_UNKNOWN * len(every):
        return (f"{sum(t == unk_token_id for t in every)} of their {len(every)} tokens are the unknown token "
                f"(id {unk_token_id})")
    if len(named) > 1 and len({tuple(ids) for ids in named.values()}) == 1:
        return "every prompt tokenizes to the same ids"
    return ""


def prompt_set(target: Any, prompts: PromptsFile | None = None) -> PromptSet:
    """The prompts every engine runs for ``target`` (see the module docstring for which); ``prompts``:
    a ``--prompts`` file, else the one the target carries (``Target.prompts``, :func:`with_prompts`)."""
    prompts = prompts if prompts is not None else getattr(target, "prompts", None)
    if prompts is not None:
        problem = tokenizer_problem(target)
        if problem:
            raise PromptsError(_synthetic_message(prompts, [(target.name, problem)]))
        tok = tokenizer_for(target)
        out = tokenize_prompts(tok, prompts.prompts, target.bos_token_id, target.max_model_len,
                               f"--prompts {prompts.path} (sha256 {prompts.sha256[:12]}…)", target.checkpoint)
        why = degenerate(out, getattr(tok, "unk_token_id", None))
        if why:
            raise PromptsError(f"--prompts {prompts.path}: under the tokenizer of {target.checkpoint} {why}, so "
                               "the run would test little; write prompts this tokenizer knows (longer lines, "
                               "words in its vocabulary), or drop --prompts to run the default prompts")
        return out
    problem = tokenizer_problem(target)
    if not problem:
        tok = tokenizer_for(target)
        out = tokenize_prompts(tok, DEFAULT_TEXT_PROMPTS, target.bos_token_id, target.max_model_len, DEFAULT_SOURCE,
                               target.checkpoint)
        problem = degenerate(out, getattr(tok, "unk_token_id", None))
        if not problem:
            return out
        problem = f"the default text prompts are degenerate under its tokenizer ({problem})"
    from harness.models.prompts import default_prompts

    return PromptSet(default_prompts(target.vocab_size, target.bos_token_id, target.max_model_len),
                     {"source": f"{TOKEN_ID_SOURCE}: {problem}", "notes": [f"token-id prompts: {problem}"]})


def _synthetic_message(prompts: PromptsFile, bad: list[tuple[str, str]]) -> str:
    names = ", ".join(n for n, _ in bad[:6]) + (f" and {len(bad) - 6} more" if len(bad) > 6 else "")
    why = bad[0][1] if len({w for _, w in bad}) == 1 else "; ".join(f"{n}: {w}" for n, w in bad[:3])
    return (f"--prompts {prompts.path}: text prompts need the checkpoint's own trained tokenizer, and {names} "
            f"{'has' if len(bad) == 1 else 'have'} none ({why}; every word of a text would be one unknown "
            "token). Select checkpoints with a real tokenizer (--model smollm2, or --model-path DIR), or drop "
            "--prompts: synthetic checkpoints run their token-id prompts (harness/models/prompts.py)")


def with_prompts(targets: list, prompts: PromptsFile | None) -> list:
    """``targets`` carrying ``prompts`` (``Target.prompts``), after checking that each has a real
    tokenizer and that every prompt tokenizes for it: errors come before any engine boots."""
    if prompts is None:
        return list(targets)
    from dataclasses import replace

    bad = [(t.name, why) for t in targets if (why := tokenizer_problem(t))]
    if bad:
        raise PromptsError(_synthetic_message(prompts, bad))
    out = [replace(t, prompts=prompts) for t in targets]
    for t in out:
        prompt_set(t)
    return out


def token_context(pieces: list[str], pos: int, width: int = 6) -> str:
    """The decoded text around token ``pos``, that token in brackets: ``…capital of [France] is…``."""
    if not pieces or not 0 <= pos < len(pieces):
        return ""
    lo, hi = max(0, pos - width), min(len(pieces), pos + width + 1)
    text = ("…" if lo else "") + "".join(pieces[lo:pos]) + "[" + pieces[pos] + "]" + "".join(pieces[pos + 1:hi])
    text += "…" if hi < len(pieces) else ""
    return text.replace("\r", "").replace("\n", "⏎")
