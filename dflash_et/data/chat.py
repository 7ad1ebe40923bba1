"""The target's tokenizer and its chat template: a prompt as the ids the target was trained to answer, and the
same rendering as a fixed prefix and suffix for runners without a template engine (dflash_runner --prompt)."""

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from tokenizers.decoders import DecodeStream
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from dflash_et.errors import REBUILD, UserError


# the tokenizer files transformers parses as JSON (package.TOKENIZER_FILES ships those the target has)
JSON_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "added_tokens.json")


def tokenizer(directory: Path) -> PreTrainedTokenizerBase:
    """The tokenizer of a checkpoint or a programs folder. A missing tokenizer.json (with no tokenizer.model), a
    tokenizer file that is not JSON, or files transformers cannot build a tokenizer from, is refused in one line
    that names the file (or the folder) and how to get it back: transformers says "Couldn't instantiate the backend
    tokenizer" in four lines, or "Expecting value: line 2 column 1", and names neither."""
    directory = Path(directory)
    problem = _unreadable(directory)
    if problem:
        raise UserError(problem)
    try:
        return AutoTokenizer.from_pretrained(directory)
    except Exception as e:  # noqa: BLE001  files that parse but do not fit: whatever transformers raises then
        raise UserError(f"{directory}: transformers cannot build a tokenizer from its files "
                        f"({type(e).__name__}: {_first_line(e)}); one of them is damaged: {REBUILD}") from None


def _unreadable(directory: Path) -> str | None:
    path = directory / "tokenizer.json"
    if not path.is_file() and not (directory / "tokenizer.model").is_file():
        return f"{path} is missing: {REBUILD}"
    for path in (directory / name for name in JSON_FILES):
        if not path.is_file():
            continue
        try:
            json.loads(path.read_bytes())
        except ValueError as e:
            return f"{path} is not JSON ({e}): it is truncated or corrupt; {REBUILD}"
    return None


def _first_line(error: Exception) -> str:
    return (str(error).strip().splitlines() or [""])[0]


def encode_chat(tok: PreTrainedTokenizerBase, prompt: str | list[dict], tools: list[dict] | None = None) -> list[int]:
    """A prompt through the chat template, generation prompt added, Qwen3 thinking off: a string is one user
    turn, a list of messages a whole conversation (the reply answers its last user turn), `tools` the functions
    it may call (OpenAI declarations). A tokenizer without a template gets the plain text, a conversation's turns
    one per line."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    if tok.chat_template is None:
        return tok.encode("\n".join(m["content"] for m in messages))
    text = tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True,
                                   enable_thinking=False)
    return tok.encode(text, add_special_tokens=False)


def reply_text(tok: PreTrainedTokenizerBase, messages: list[dict], reply: dict, tools: list[dict] | None = None) -> str:
    """What a model writes after `encode_chat(tok, messages, tools)` to give the assistant message `reply`, up to its
    end of turn: the template's own rendering of that message in the conversation, so a tool call comes out in the
    family's format (Qwen3's Hermes `<tool_call>`, Gemma 4's `<|tool_call>call:..`), as a server's parser reads it.
    The turn's header is what its tokens share with the generation prompt's (which may go on, as Qwen3's empty
    think block does)."""
    before = tok.apply_chat_template(messages, tools=tools, tokenize=False, enable_thinking=False)
    turn = tok.apply_chat_template([*messages, reply], tools=tools, tokenize=False, enable_thinking=False)
    prompt = tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True,
                                     enable_thinking=False)
    if not (turn.startswith(before) and prompt.startswith(before)):
        raise ValueError("the chat template renders earlier turns differently once a reply follows; its replies "
                         "cannot be cut out of a conversation")
    ids, opening = (tok.encode(text[len(before):], add_special_tokens=False) for text in (turn, prompt))
    shared = next((i for i, (a, b) in enumerate(zip(ids, opening)) if a != b), min(len(ids), len(opening)))
    body = turn[len(before) + len(tok.decode(ids[:shared], clean_up_tokenization_spaces=False)):]
    return body.split(tok.eos_token)[0]


@dataclass(frozen=True)
class ChatFormat:
    """`encode_chat` of one user message without Jinja, for runners that cannot render templates (dflash_runner
    --prompt): the ids of `prefix + message + suffix` tokenized in one encode without the tokenizer's own special
    tokens, between `before` and `after`, the ids the tokenizer adds itself (a tokenizer without a chat template
    encodes the plain message with them: its BOS, say). The package step writes it as FILE beside the tokenizer."""

    prefix: str
    suffix: str
    before: list[int]
    after: list[int]

    FILE = "chat_format.json"

    def encode(self, tok: PreTrainedTokenizerBase, message: str) -> list[int]:
        return [*self.before, *tok.encode(self.prefix + message + self.suffix, add_special_tokens=False), *self.after]

    def write(self, directory: Path) -> Path:
        path = directory / self.FILE
        path.write_text(json.dumps(asdict(self), ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
        return path

    @classmethod
    def read(cls, directory: Path) -> "ChatFormat":
        data = json.loads((directory / cls.FILE).read_text(encoding="utf-8"))
        return cls(**{f.name: data[f.name] for f in fields(cls)})


# Two unlike messages (inner and edge whitespace, non-ASCII): a template that strips, changes or repeats the
# message renders them as other than one fixed prefix and suffix around them.
CHAT_FORMAT_PROBES = ("  dflash probe: One\n two \u00e9\u4e16\U0001f600 \n", "DFLASH-PROBE-2")


def chat_format(tok: PreTrainedTokenizerBase) -> ChatFormat | None:
    """The tokenizer's rendering of one user turn (as `encode_chat` renders it) as a fixed prefix and suffix, or None
    when its chat template is not one: then only a runner with the template can format a prompt."""
    splits = set()
    for probe in CHAT_FORMAT_PROBES:
        if tok.chat_template is None:
            text, plain = probe, tok.encode(probe, add_special_tokens=False)
            full = tok.encode(probe)
            at = next((i for i in range(len(full) - len(plain) + 1) if full[i:i + len(plain)] == plain), None)
            if at is None:  # the tokenizer's own special tokens change the message's ids
                return None
            added = (tuple(full[:at]), tuple(full[at + len(plain):]))
        else:
            try:
                text = tok.apply_chat_template([{"role": "user", "content": probe}], tokenize=False,
                                               add_generation_prompt=True, enable_thinking=False)
            except Exception:  # noqa: BLE001  the template's own refusal (raise_exception) or failure
                return None
            added = ((), ())
        if text.count(probe) != 1:
            return None
        prefix, _, suffix = text.partition(probe)
        splits.add((prefix, suffix, *added))
    if len(splits) != 1:
        return None
    prefix, suffix, before, after = splits.pop()
    found = ChatFormat(prefix, suffix, list(before), list(after))
    if any(found.encode(tok, probe) != encode_chat(tok, probe) for probe in CHAT_FORMAT_PROBES):
        return None
    return found


# transformers' clean-up rewrites at most this many characters at the end of a text once more text follows
# (" n't" -> "n't", " ." -> "."): the re-decoding path shows them only once the reply goes past them
CLEAN_UP_REACH = 4


class TextStream:
    """A reply's text as its tokens arrive: at every step a prefix of `tok.decode(tokens so far,
    skip_special_tokens=True)`, all of it but a character still waiting for its last bytes; `end()` adds the
    rest. A fast tokenizer decodes only the new tokens (`tokenizers`' DecodeStream), so streaming a long reply
    costs the same per token at its end as at its start; one that cleans up spaces (or a slow one) re-decodes
    the whole reply each step and holds back the last characters, which a later token can still rewrite."""

    def __init__(self, tok: PreTrainedTokenizerBase):
        self.tok, self.ids, self.text = tok, [], ""
        incremental = tok.is_fast and not tok.clean_up_tokenization_spaces
        self.stream = DecodeStream(skip_special_tokens=True) if incremental else None

    def push(self, ids: list[int]) -> str:
        """The text the new `ids` add."""
        self.ids.extend(ids)
        if self.stream is not None:
            new = "".join(piece for i in ids if (piece := self.stream.step(self.tok.backend_tokenizer, i)) is not None)
        else:
            text = self.tok.decode(self.ids, skip_special_tokens=True).rstrip("\ufffd")[:-CLEAN_UP_REACH]
            new = text[len(self.text):] if text.startswith(self.text) else ""
        self.text += new
        return new

    def end(self) -> str:
        """The rest of the reply's text, once its last token is in."""
        text = self.tok.decode(self.ids, skip_special_tokens=True)
        rest = text[len(self.text):] if text.startswith(self.text) else ""
        self.text += rest
        return rest
