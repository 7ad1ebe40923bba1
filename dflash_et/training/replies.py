"""The target's replies to many prompts at the CPU's speed: a decode loop over a fixed number of slots, each row at
its own length, that refills a slot with the next prompt as soon as its reply ends. Greedy (the training replies)
or sampled with a generator per prompt (the prompts the target writes itself: training.synthesize), so a reply is
the same whichever rows it shared its steps with.

transformers' `generate` steps every row of a batch until the longest reply ends and pads every prompt to the
longest: 62% of its row-steps were kept at batch 64 (docs/measurements.md#a-draft-from-two-cpu-cores). Here no
row-step is spent on a finished reply, a prompt is padded only to those admitted with it, and the K/V rows live in
one preallocated tensor per layer (no concatenation a step). It runs transformers' own modules (the model is the
one `generate` would run) with a 4D mask and per-row positions, so it serves the families whose every layer is full
causal attention behind `cache.update` (Llama, Qwen3, SmolLM2...); `decode` keeps `generate` for the rest.
"""

import torch
from tqdm import tqdm

from dflash_et.runtime.sampling import Sampling, distribution


def slotted(model) -> bool:
    """Whether `replies` runs `model`: a decoder (`model.model`, `model.lm_head`) whose every layer is full causal
    attention (no sliding window, no linear attention, no K/V shared across layers), as Llama's and Qwen3's."""
    config = model.config.get_text_config()
    kinds = set(getattr(config, "layer_types", None) or ["full_attention"])
    return (kinds == {"full_attention"} and not getattr(config, "sliding_window", None)
            and not getattr(config, "num_kv_shared_layers", 0) and hasattr(model, "model")
            and hasattr(model, "lm_head"))


class SlotCache:
    """K/V rows of `slots` sequences for transformers' attention layers (which call `update`): a call writes the rows
    `rows` at positions `positions` [n, T] and attends over the first `width` positions of those rows."""

    def __init__(self, layers: int, slots: int, kv_heads: int, length: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device):
        self.k = torch.zeros(layers, slots, kv_heads, length, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.rows, self.positions, self.width, self.every_row = None, None, 0, False

    def call(self, rows: torch.Tensor, positions: torch.Tensor, width: int) -> None:
        self.rows, self.positions, self.width = rows, positions, width
        self.every_row = len(rows) == self.k.shape[1] and bool((rows.cpu() == torch.arange(len(rows))).all())

    def update(self, k: torch.Tensor, v: torch.Tensor, layer: int, **_) -> tuple[torch.Tensor, torch.Tensor]:
        """Writes this call's k/v [n, heads, T, D] and returns the rows' cached k/v [n, heads, width, D] (views when
        the call is every slot's: a decode step copies nothing)."""
        where = (self.rows[:, None], slice(None), self.positions)
        self.k[layer][where] = k.transpose(1, 2)
        self.v[layer][where] = v.transpose(1, 2)
        if self.every_row:
            return self.k[layer][:, :, :self.width], self.v[layer][:, :, :self.width]
        return self.k[layer][self.rows, :, :self.width], self.v[layer][self.rows, :, :self.width]


def decode(model, prompts: list[list[int]], order: list[int], max_new_tokens: int, eos: set[int], batch: int,
           stop=lambda: False, sampling: Sampling = Sampling(), seed: int = 0, desc: str = "target replies"
           ) -> dict[int, list[int]]:
    """{prompt index: the target's reply, ending at its first `eos` token (or at `max_new_tokens`)}, `batch` prompts
    decoded at a time in `order`: in slots (`slotted` families) or through transformers' `generate` on left-padded
    batches. Greedy, or sampled as `sampling` says from `seed` (slots: a generator per prompt index; `generate`:
    torch's global one, seeded per batch). Once `stop()` is true (tried after the first batch) no prompt is taken
    and the replies under way finish."""
    with torch.no_grad(), tqdm(total=len(order), desc=f"[train_draft] {desc}", unit="reply") as bar:
        run = replies if slotted(model) else generated
        return run(model, prompts, order, max_new_tokens, eos, batch, stop, sampling, seed, bar)


def generated(model, prompts: list[list[int]], order: list[int], max_new_tokens: int, eos: set[int], batch: int,
              stop, sampling: Sampling, seed: int, bar: tqdm) -> dict[int, list[int]]:
    """`decode` through transformers' `generate`."""
    device = model.device
    pad = next(iter(sorted(eos)), 0)
    out: dict[int, list[int]] = {}
    warpers = {} if sampling.greedy else {"temperature": sampling.temperature, "top_p": sampling.top_p,
                                          "top_k": sampling.top_k or 0}
    for first in range(0, len(order), batch):
        if out and stop():
            break
        picks = order[first:first + batch]
        width = max(len(prompts[i]) for i in picks)
        ids = torch.full((len(picks), width), pad)
        attention = torch.zeros(len(picks), width, dtype=torch.long)
        for row, i in enumerate(picks):
            ids[row, width - len(prompts[i]):] = torch.tensor(prompts[i])
            attention[row, width - len(prompts[i]):] = 1
        torch.manual_seed(seed * 100003 + first)
        sequences = model.generate(input_ids=ids.to(device), attention_mask=attention.to(device),
                                   max_new_tokens=max_new_tokens, do_sample=not sampling.greedy, **warpers,
                                   eos_token_id=sorted(eos) or None, pad_token_id=pad).cpu()
        for row, i in enumerate(picks):
            reply = sequences[row, width:].tolist()
            out[i] = next((reply[:j + 1] for j, t in enumerate(reply) if t in eos), reply)
        bar.update(len(picks))
    return out


def replies(model, prompts: list[list[int]], order: list[int], max_new_tokens: int, eos: set[int], slots: int,
            stop, sampling: Sampling, seed: int, bar: tqdm) -> dict[int, list[int]]:
    """`decode` in `slots` rows."""
    config, device = model.config.get_text_config(), model.device
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    slots = min(slots, len(order))
    length = max(len(prompts[i]) for i in order) + max_new_tokens
    cache = SlotCache(config.num_hidden_layers, slots, config.num_key_value_heads, length, head_dim, model.dtype,
                      device)
    owner = [-1] * slots              # the prompt index each slot answers (-1: free)
    size = torch.zeros(slots, dtype=torch.long, device=device)  # positions each slot holds (its next token's)
    last = torch.zeros(slots, dtype=torch.long, device=device)  # each slot's latest token, the next step's input
    out: dict[int, list[int]] = {}
    waiting = list(reversed(order))

    def step(rows: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor,
             ends: torch.Tensor, answering: list[int]) -> torch.Tensor:
        """The next token of each row (of the prompts `answering`) after `tokens` at `positions`."""
        cache.call(rows, positions, mask.shape[-1])
        hidden = model.model(input_ids=tokens, position_ids=positions, attention_mask=mask[:, None], cache=cache,
                             use_cache=True).last_hidden_state
        logits = model.lm_head(hidden[torch.arange(len(rows), device=device), ends])
        if sampling.greedy:
            return logits.argmax(-1)
        probs = distribution(logits, sampling)
        return torch.cat([torch.multinomial(probs[r], 1, generator=generator(i)) for r, i in enumerate(answering)])

    generators: dict[int, torch.Generator] = {}

    def generator(i: int) -> torch.Generator:
        """Prompt i's own: its reply does not depend on which rows shared its steps."""
        if i not in generators:
            generators[i] = torch.Generator(device=device).manual_seed(seed * 100003 + i)
        return generators[i]

    def admit(free: list[int]) -> None:
        picks = [waiting.pop() for _ in range(min(len(free), len(waiting)))]
        rows = torch.tensor(free[:len(picks)], device=device)
        lengths = torch.tensor([len(prompts[i]) for i in picks], device=device)
        width = int(lengths.max())
        tokens = torch.zeros(len(picks), width, dtype=torch.long)
        for r, i in enumerate(picks):
            tokens[r, :len(prompts[i])] = torch.tensor(prompts[i])
        at = torch.arange(width, device=device)
        mask = (at[None, :, None] >= at[None, None, :]) & (at[None, None, :] < lengths[:, None, None])
        first = step(rows, tokens.to(device), at.expand(len(picks), width), mask, lengths - 1, picks)
        for r, i in enumerate(picks):
            owner[int(rows[r])], out[i] = i, []
        size[rows], last[rows] = lengths, first
        record(rows)

    def record(rows: torch.Tensor) -> None:
        """Appends each row's latest token to its reply; frees the rows whose reply ended."""
        for row, token in zip(rows.tolist(), last[rows].tolist()):
            reply = out[owner[row]]
            reply.append(token)
            if reply[-1] in eos or len(reply) >= max_new_tokens:
                owner[row] = -1
                bar.update(1)

    while True:
        free = [s for s in range(slots) if owner[s] < 0]
        if free and waiting and (not out or not stop()):
            admit(free)
            continue
        busy = [s for s in range(slots) if owner[s] >= 0]
        if not busy:
            return out
        rows = torch.tensor(busy, dtype=torch.long, device=device)
        positions = size[rows][:, None]
        width = int(positions.max()) + 1
        mask = torch.arange(width, device=device)[None, None, :] <= positions[:, :, None]
        last[rows] = step(rows, last[rows][:, None], positions, mask, torch.zeros_like(rows), [owner[s] for s in busy])
        size[rows] += 1
        record(rows)
