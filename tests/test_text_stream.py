"""`dflash generate`'s streamed text (data.chat.TextStream): at every step what the reply so far decodes to, for
byte-level BPE (GPT-2's split, Qwen's, SmolLM2's) and SentencePiece-style (Metaspace) tokenizers, with special
tokens among the reply's; decoding only the new tokens where the tokenizer allows it."""

import pytest
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from dflash_et.checkpoints.builtin import build_tokenizer
from dflash_et.checkpoints.fetch import smollm2_gguf
from dflash_et.data.chat import CLEAN_UP_REACH, TextStream
from dflash_et.data.corpus import samples
from tests.test_runner_text import PROMPTS, QWEN_SPLIT


def metaspace_tokenizer() -> PreTrainedTokenizerFast:
    """Llama 2's and Gemma's kind: '▁' for spaces, a decoder that turns it back and strips the first one."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="never")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    trainer = trainers.BpeTrainer(vocab_size=1200, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False)
    tok.train_from_iterator([*PROMPTS, *(f"{p}\n{a}" for _, p, a in samples(500, seed=1))], trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


def smollm2() -> PreTrainedTokenizerFast:
    gguf = smollm2_gguf()
    return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)


TOKENIZERS = {"gpt2-split": build_tokenizer, "qwen-split": lambda: build_tokenizer(split=QWEN_SPLIT),
              "smollm2": smollm2, "metaspace": metaspace_tokenizer}


def reply_ids(tok) -> list[int]:
    """Every prompt's ids, an end-of-text token between them (a special token the reply's text skips)."""
    ids = []
    for text in PROMPTS:
        ids += [*tok.encode(text, add_special_tokens=False), tok.eos_token_id]
    return ids


def check_stream(tok, ids: list[int], step: int) -> None:
    stream = TextStream(tok)
    for i in range(0, len(ids), step):
        new = stream.push(ids[i:i + step])
        whole = tok.decode(ids[:i + step], skip_special_tokens=True)
        rest = whole[len(stream.text):]
        assert whole.startswith(stream.text) and stream.text.endswith(new), (i, stream.text[-20:], rest)
        if stream.stream is not None:  # all of it, or all but the tokens of a character still waiting for its bytes
            assert rest == "" or "\ufffd" in rest, (i, rest)
        else:  # and the last characters, which clean-up may still rewrite
            assert len(rest.rstrip("\ufffd")) <= CLEAN_UP_REACH, (i, rest)
    stream.end()
    assert stream.text == tok.decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize("step", [1, 3])
@pytest.mark.parametrize("name", TOKENIZERS)
def test_streamed_text_is_the_decoded_reply_at_every_step(name, step):
    tok = TOKENIZERS[name]()
    assert not tok.clean_up_tokenization_spaces and TextStream(tok).stream is not None  # the incremental path
    check_stream(tok, reply_ids(tok), step)


def test_the_incremental_path_never_decodes_the_whole_reply(monkeypatch):
    tok = build_tokenizer()
    ids = reply_ids(tok)
    stream = TextStream(tok)
    monkeypatch.setattr(tok, "decode", lambda *a, **k: pytest.fail("re-decoded the reply"))
    for i in ids:
        stream.push([i])
    monkeypatch.undo()
    assert stream.end() == "" and stream.text == tok.decode(ids, skip_special_tokens=True)


def test_a_tokenizer_that_cleans_up_spaces_streams_its_cleaned_text():
    """transformers' clean-up (" ." -> ".", " 's" -> "'s"; it applies it to WordPiece and Unigram vocabularies, to BPE
    only when forced) can change text before the newest token: a tokenizer asking for it re-decodes, and what
    streams is still what the whole reply decodes to."""
    tok = build_tokenizer()
    tok.clean_up_tokenization_spaces = True
    tok.clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output = True
    ids = tok.encode("it 's a test . is n't it ? yes , it is !", add_special_tokens=False) + reply_ids(tok)
    assert TextStream(tok).stream is None
    assert tok.decode(ids, skip_special_tokens=True) != tok.decode(ids, skip_special_tokens=True,
                                                                   clean_up_tokenization_spaces=False)
    check_stream(tok, ids, 1)
