#include "text.h"

#include <fstream>
#include <sstream>
#include <type_traits>
#include <utility>

#include <nlohmann/json.hpp>
#include <pytorch/tokenizers/hf_tokenizer.h>

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

// Whether the tokenizers library reads ByteLevel's use_regex (1.0.1, the pinned sdist, does not: it always splits
// with the GPT-2 pattern; later sources do).
template <typename Config, typename = void>
struct reads_use_regex : std::false_type {};
template <typename Config>
struct reads_use_regex<Config, std::void_t<decltype(std::declval<Config>().use_regex)>> : std::true_type {};

// What HFTokenizer would read otherwise than Hugging Face's tokenizers, silently: ByteLevel without the regex
// (unless it reads use_regex), merges as strings (it reads pairs), added tokens that strip the spaces around them
// (it matches them as they are), a normalizer or decoder it does not know (it drops them). Empty when none.
std::string unsupported(const json& t) {
  for (const auto& added : t.value("added_tokens", json::array())) {
    if (added.value("lstrip", false) || added.value("rstrip", false) || added.value("single_word", false)) {
      return "the added token " + added.value("content", std::string()) + " with lstrip, rstrip or single_word";
    }
  }
  const json& model = t.value("model", json::object());
  if (model.value("type", "") != "BPE") return "a " + model.value("type", std::string("model-less")) + " model, not BPE";
  const json& merges = model.value("merges", json::array());
  if (!merges.empty() && !merges[0].is_array()) return "merges written as strings (older tokenizers), not pairs";
  std::vector<json> parts{t.value("pre_tokenizer", json())};
  for (size_t i = 0; i < parts.size(); ++i) {
    if (parts[i].is_object() && parts[i].value("type", "") == "Sequence") {
      for (const auto& p : parts[i].value("pretokenizers", json::array())) parts.push_back(p);
    } else if (!reads_use_regex<tokenizers::PreTokenizerConfig>::value && parts[i].is_object() &&
               parts[i].value("type", "") == "ByteLevel" && !parts[i].value("use_regex", true)) {
      return "a ByteLevel pre-tokenizer with use_regex=false (as Qwen's and Llama 3's)";
    }
  }
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

}  // namespace

Text::Text(const std::string& dir) : tokenizer_(std::make_unique<tokenizers::HFTokenizer>()) {
  const std::string path = dir + "/tokenizer.json";
  const json config = read_json(path, "; --prompt needs the target's tokenizer beside the programs");
  if (const std::string why = unsupported(config); !why.empty()) {
    throw UserError(path + " has " + why + ", which the C++ tokenizer (pytorch-tokenizers' HFTokenizer) would not "
                    "read as Hugging Face's does" + kPromptIds);
  }
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
  const auto encoded = tokenizer_->encode(prefix_ + message + suffix_, 0, 0);
  if (!encoded.ok()) throw UserError("the C++ tokenizer cannot encode this prompt" + std::string(kPromptIds));
  std::vector<int64_t> ids = before_;
  ids.insert(ids.end(), encoded.get().begin(), encoded.get().end());
  ids.insert(ids.end(), after_.begin(), after_.end());
  return ids;
}

std::string Text::bytes(int64_t token) const {
  if (token < 0 || special_.count(token)) return "";
  const auto piece = tokenizer_->decode(0, static_cast<uint64_t>(token));
  return piece.ok() ? piece.get() : "";
}

std::string TextStream::add(const std::vector<int64_t>& tokens) {
  for (int64_t t : tokens) pending_ += text_.bytes(t);
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
