#include "text.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <utility>

#include <nlohmann/json.hpp>
#include <pytorch/tokenizers/hf_tokenizer.h>
#include <unicode.h>

#include "nfc_table.h"
#include "programs.h"

namespace dflash {
namespace {

using json = nlohmann::json;

const char* const kPromptIds = "; give --prompt-ids instead (the prompt's ids, chat template applied)";

json read_json(const std::string& path, const std::string& missing) {
  if (!is_file(path)) throw UserError(path + " is missing" + missing + kPromptIds);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  try {
    return json::parse(text.str());
  } catch (const json::exception& e) {
    throw UserError(path + " is not JSON (" + e.what() + ")" + kPromptIds);
  }
}

// What HFTokenizer would read otherwise than Hugging Face's tokenizers, silently: added tokens that strip the spaces
// around them (it matches them as they are), a normalizer or decoder it does not know (it drops them). Empty when
// none. (ByteLevel's use_regex and merges written as strings it reads with runner/patches/ applied.)
std::string unsupported(const json& t) {
  for (const auto& added : t.value("added_tokens", json::array())) {
    if (added.value("lstrip", false) || added.value("rstrip", false) || added.value("single_word", false)) {
      return "the added token " + added.value("content", std::string()) + " with lstrip, rstrip or single_word";
    }
  }
  const json& model = t.value("model", json::object());
  if (model.value("type", "") != "BPE") return "a " + model.value("type", std::string("model-less")) + " model, not BPE";
  for (const char* step : {"normalizer", "decoder"}) {
    const bool decoder = std::string(step) == "decoder";
    const std::set<std::string> known = decoder ? std::set<std::string>{"ByteLevel", "Replace", "ByteFallback", "Fuse"}
                                                : std::set<std::string>{"Replace", "NFC"};
    std::vector<json> steps{t.value(step, json())};
    if (steps[0].is_null() && decoder) return "no decoder";
    for (size_t i = 0; i < steps.size(); ++i) {
      if (steps[i].is_null()) continue;
      const std::string type = steps[i].value("type", "");
      if (type == "Sequence") {
        for (const auto& s : steps[i].value(decoder ? "decoders" : "normalizers", json::array())) steps.push_back(s);
      } else if (!known.count(type)) {
        return std::string("a ") + type + " " + step;
      }
    }
  }
  return "";
}

std::vector<int64_t> integers(const json& format, const char* key) {
  return format.at(key).get<std::vector<int64_t>>();
}

// `b` as UTF-8 appended to `out`, each ill-formed sequence as one U+FFFD (a maximal subpart at a time, as Python
// and Rust replace); returns where an unfinished character at the end begins (b.size() when none, or when `last`).
size_t utf8(const std::string& b, std::string& out, bool last) {
  size_t i = 0;
  while (i < b.size()) {
    const auto c = static_cast<unsigned char>(b[i]);
    size_t need = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // the second byte's range
    if (c < 0x80) {
      out += b[i++];
      continue;
    } else if (c >= 0xC2 && c <= 0xDF) {
      need = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
      need = 2, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    } else if (c >= 0xF0 && c <= 0xF4) {
      need = 3, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    }
    size_t j = 1;
    for (; j <= need && i + j < b.size(); ++j) {
      const auto d = static_cast<unsigned char>(b[i + j]);
      if (d < (j == 1 ? lo : 0x80) || d > (j == 1 ? hi : 0xBF)) break;
    }
    if (need && j > need) {
      out.append(b, i, need + 1);
    } else if (need && i + j == b.size() && !last) {
      return i;
    } else {
      out += "\xEF\xBF\xBD";
    }
    i += j;
  }
  return i;
}

// Whether tokenizer.json's normalizer (or one in its Sequence) is NFC.
bool normalizes_to_nfc(const json& t) {
  std::vector<json> steps{t.value("normalizer", json())};
  for (size_t i = 0; i < steps.size(); ++i) {
    if (!steps[i].is_object()) continue;
    if (steps[i].value("type", "") == "NFC") return true;
    for (const auto& s : steps[i].value("normalizers", json::array())) steps.push_back(s);
  }
  return false;
}

// The first code point of `text` that NFC might change (nfc_table.h), or -1: text without one is its own NFC form.
int64_t not_surely_nfc(const std::string& text) {
  for (const uint32_t cp : unicode_cpts_from_utf8(text)) {
    const auto* end = std::end(kNotSurelyNfc);
    const auto* it = std::upper_bound(std::begin(kNotSurelyNfc), end, cp,
                                      [](uint32_t c, const std::pair<uint32_t, uint32_t>& r) { return c < r.first; });
    if (it != std::begin(kNotSurelyNfc) && cp <= (it - 1)->second) return cp;
  }
  return -1;
}

}  // namespace

Text::Text(const std::string& dir) : tokenizer_(std::make_unique<tokenizers::HFTokenizer>()) {
  const std::string path = dir + "/tokenizer.json";
  const json config = read_json(path, "; --prompt needs the target's tokenizer beside the programs");
  if (const std::string why = unsupported(config); !why.empty()) {
    throw UserError(path + " has " + why + ", which the C++ tokenizer (pytorch-tokenizers' HFTokenizer) would not "
                    "read as Hugging Face's does" + kPromptIds);
  }
  nfc_ = normalizes_to_nfc(config);
  for (const auto& added : config.value("added_tokens", json::array())) {
    if (added.value("special", false)) special_.insert(added.at("id").get<int64_t>());
  }
  if (tokenizer_->load(path) != tokenizers::Error::Ok) {
    throw UserError("the C++ tokenizer (pytorch-tokenizers' HFTokenizer) cannot load " + path + kPromptIds);
  }
  const json format = read_json(dir + "/" + kChatFormatFile,
                                " (written by dflash-et's package step unless the target's chat template is not a "
                                "fixed text around the message, which only a template engine can render)");
  prefix_ = format.at(kPrefix).get<std::string>();
  suffix_ = format.at(kSuffix).get<std::string>();
  before_ = integers(format, kBefore);
  after_ = integers(format, kAfter);
}

Text::~Text() = default;

std::vector<int64_t> Text::prompt(const std::string& message) const {
  std::vector<int64_t> ids = before_;
  const std::vector<int64_t> encoded = encode(prefix_ + message + suffix_);
  ids.insert(ids.end(), encoded.begin(), encoded.end());
  ids.insert(ids.end(), after_.begin(), after_.end());
  return ids;
}

std::vector<int64_t> Text::encode(const std::string& text) const {
  if (const int64_t cp = nfc_ ? not_surely_nfc(text) : -1; cp >= 0) {
    char name[16];
    std::snprintf(name, sizeof name, "U+%04llX", static_cast<unsigned long long>(cp));
    throw UserError(std::string("the prompt has ") + name + ", which the tokenizer's NFC normalization may change and "
                    "the C++ tokenizer cannot normalize; give the text in NFC form (unicodedata.normalize) or "
                    "--prompt-ids instead");
  }
  const auto encoded = tokenizer_->encode(text, 0, 0);
  if (!encoded.ok()) throw UserError("the C++ tokenizer cannot encode this prompt" + std::string(kPromptIds));
  return {encoded.get().begin(), encoded.get().end()};
}

std::string Text::bytes(int64_t token, bool special) const {
  if (token < 0 || (!special && special_.count(token))) return "";
  const auto piece = tokenizer_->decode(0, static_cast<uint64_t>(token));
  return piece.ok() ? piece.get() : "";
}

std::string TextStream::add(const std::vector<int64_t>& tokens) {
  for (int64_t t : tokens) pending_ += text_.bytes(t, special_);
  std::string out;
  pending_.erase(0, utf8(pending_, out, false));
  return out;
}

std::string TextStream::finish() {
  std::string out;
  utf8(pending_, out, true);
  pending_.clear();
  return out;
}

}  // namespace dflash
