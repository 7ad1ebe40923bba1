// Text in, text out (--prompt): the user's message through the chat format the package step writes beside the
// tokenizer (dflash_et/data/prompts.py: ChatFormat, whose names tests/test_cpp_text.py holds these to), tokenized
// by the tokenizer ExecuTorch's LLM runners use (pytorch-labs tokenizers' HFTokenizer) from tokenizer.json; the
// reply decoded as `dflash generate` decodes it (`tok.decode(ids, skip_special_tokens=True)`), streamed.
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace tokenizers {
class HFTokenizer;
}

namespace dflash {

// The chat format's file and keys: the text around the message, the ids the tokenizer adds itself around the encoding
inline constexpr const char *kChatFormatFile = "chat_format.json", *kPrefix = "prefix", *kSuffix = "suffix",
                            *kBefore = "before", *kAfter = "after";

class Text {
 public:
  // The tokenizer and chat format in `dir` (the programs' directory); a UserError says what is missing.
  explicit Text(const std::string& dir);
  ~Text();
  // One user message as `encode_chat` encodes it.
  std::vector<int64_t> prompt(const std::string& message) const;
  // Text as `tok.encode(text, add_special_tokens=False)` encodes it: special tokens written in it are read as such.
  std::vector<int64_t> encode(const std::string& text) const;
  // A token's bytes in the decoded text: none for an id the tokenizer does not have, nor for a special token unless
  // `special` (then its own text, as `skip_special_tokens=False` decodes it).
  std::string bytes(int64_t token, bool special = false) const;

 private:
  std::unique_ptr<tokenizers::HFTokenizer> tokenizer_;
  std::set<int64_t> special_;  // tokenizer.json's added tokens marked special: what skip_special_tokens skips
  std::string prefix_, suffix_;
  std::vector<int64_t> before_, after_;
  bool nfc_ = false;  // tokenizer.json normalizes to NFC, which the tokenizer leaves to the text (nfc_table.h)
};

// The reply's text as it grows: `add` returns what can be printed now (whole characters), `finish` the rest,
// so that everything printed is the tokens' decoded text (invalid UTF-8 as U+FFFD, as Python decodes it). With
// `special`, special tokens are written too: a server's content filters and tool parsers read the markers some
// families write as special tokens (Gemma 4's `<|channel>`, `<|tool_call>`).
class TextStream {
 public:
  explicit TextStream(const Text& text, bool special = false) : text_(text), special_(special) {}
  std::string add(const std::vector<int64_t>& tokens);
  std::string finish();

 private:
  const Text& text_;
  const bool special_;
  std::string pending_;  // bytes of an unfinished character
};

}  // namespace dflash
