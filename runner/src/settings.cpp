#include "settings.h"

#include <sys/resource.h>

#include <cmath>
#include <fstream>

namespace dflash {

int64_t number(const std::string& text, const std::string& what) {
  try {
    size_t used = 0;
    const long long value = std::stoll(text, &used);
    if (used == text.size()) return value;
  } catch (const std::exception&) {
  }
  throw UserError(what + " must be an integer, got '" + text + "'");
}

double real(const std::string& text, const std::string& what) {
  try {
    size_t used = 0;
    const double value = std::stod(text, &used);
    if (used == text.size()) return value;
  } catch (const std::exception&) {
  }
  throw UserError(what + " must be a number, got '" + text + "'");
}

void set(Sampling& s, const std::string& name, const std::string& value) {
  if (name == "temperature") {
    s.temperature = real(value, name);
    if (!(s.temperature >= 0 && std::isfinite(s.temperature))) {
      throw UserError("temperature must be 0 (greedy) or a positive number, got " + value);
    }
  } else if (name == "top_p") {
    s.top_p = real(value, name);
    if (!(s.top_p > 0 && s.top_p <= 1)) {
      throw UserError("top_p must be in (0, 1], got " + value + "; 1 turns top-p off");
    }
  } else if (name == "top_k") {
    s.top_k = number(value, name);
    if (s.top_k < 0) throw UserError("top_k must be at least 1 (0: off), got " + value);
  } else if (name == "proposals") {
    if (value != "argmax" && value != "sample") throw UserError("proposals must be argmax or sample, got " + value);
    s.sample_proposals = value == "sample";
  } else if (name == "seed") {
    s.seed = static_cast<uint64_t>(number(value, name));
  } else {
    throw UserError("unknown sampling setting " + name);
  }
}

int64_t block_size(const std::string& text) {
  return text == "auto" ? kAuto : number(text, "the block size");
}

long peak_rss_kb() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stol(line.substr(6));
  }
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
#ifdef __APPLE__
  return usage.ru_maxrss / 1024;  // bytes there
#else
  return usage.ru_maxrss;
#endif
}

nlohmann::json record(const Generation& g) {
  nlohmann::json rounds = nlohmann::json::array();
  for (const Round& r : g.rounds) {
    rounds.push_back({{"verified", r.verified}, {"accepted", r.accepted}, {"emitted", r.emitted},
                      {"draft_s", r.draft_s}, {"verify_s", r.verify_s}, {"total_s", r.total_s},
                      {"drafted", r.drafted}, {"looked_up", r.looked_up}});
  }
  return {{"tokens", g.tokens}, {"prefill_s", g.prefill_s}, {"rounds", rounds}, {"peak_rss_kb", peak_rss_kb()}};
}

}  // namespace dflash
