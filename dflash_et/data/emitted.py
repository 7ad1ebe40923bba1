"""The tokens a target emits, and the draft vocabulary they choose (`export.draft_vocab`).

A draft's borrowed head scores every token of the target's vocabulary at every block position, most of a draft
call on a real vocabulary (SmolLM2: 49,152 rows, Qwen3 151,936), yet a target's replies use a small share of it.
A draft trained here records how often the target emitted each token in the replies it trained on
(`token_counts.json` beside its weights); the reduced head keeps the N most emitted, every special token and
every end of turn. A draft without that record (z-lab's, the random built-in one) keeps the N lowest ids: a
byte-level BPE numbers its bytes and earliest, most frequent merges first.

Exactness does not depend on the choice: tokens outside the set get no proposal (probability zero), and the
target alone decides what is accepted.
"""

import json
from collections import Counter
from itertools import chain
from pathlib import Path

TOKEN_COUNTS = "token_counts.json"


def write_counts(out_dir: Path, replies: list[list[int]]) -> None:
    """Record how often each token occurs in `replies` (the target's own) in `out_dir`/token_counts.json."""
    counts = Counter(t for reply in replies for t in reply)
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    (out_dir / TOKEN_COUNTS).write_text(json.dumps({"replies": len(replies), "tokens": sum(counts.values()),
                                                    "counts": {str(t): n for t, n in ranked}}) + "\n")


def read_counts(draft_dir: Path) -> dict[int, int]:
    """The draft's record of the tokens its target emitted (empty when it has none)."""
    path = draft_dir / TOKEN_COUNTS
    if not path.is_file():
        return {}
    return {int(t): n for t, n in json.loads(path.read_text())["counts"].items()}


def kept_ids(counts: dict[int, int], size: int, vocab_size: int, always: set[int]) -> list[int]:
    """The `size` token ids a reduced head scores, ascending: every id of `always`, then the most counted (ties:
    the lower id), then the lowest ids not yet chosen."""
    if not len(always) <= size <= vocab_size:
        raise ValueError(f"export.draft_vocab={size} must be at least the target's {len(always)} special and "
                         f"end-of-turn tokens and at most its vocabulary of {vocab_size}; use a size in between "
                         "or full")
    chosen = set(always)
    ranked = sorted((t for t in counts if t < vocab_size), key=lambda t: (-counts[t], t))
    for t in chain(ranked, range(vocab_size)):
        if len(chosen) == size:
            break
        chosen.add(t)
    return sorted(chosen)


def head_ids(tok, eos: set[int], counts: dict[int, int], size: int, vocab_size: int) -> list[int]:
    """`kept_ids` for a target whose tokenizer is `tok` and end-of-turn ids `eos`: export.draft_vocab's set, and the
    one train_draft.head_vocab trains the draft on (the same counts give the same set)."""
    always = {t for t in {*eos, *tok.all_special_ids, *tok.added_tokens_decoder} if t < vocab_size}
    return kept_ids(counts, size, vocab_size, always)


def coverage(counts: dict[int, int], ids: list[int]) -> float | None:
    """The share of the counted tokens that `ids` holds (None: nothing counted)."""
    total = sum(counts.values())
    kept = set(ids)
    return sum(n for t, n in counts.items() if t in kept) / total if total else None
