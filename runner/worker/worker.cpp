#include "worker.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <list>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "protocol.h"

namespace dflash {
namespace {

constexpr size_t kMaxSessions = 64;  // named sessions kept at once (their bookkeeping only: one cache)
constexpr const char* kControlFdVariable = "EXECUTORCH_LLM_WORKER_CONTROL_FD";

// The cancellation channel: request ids, read without waiting, remembered until their request has passed.
class Control {
 public:
  Control() {
    if (const char* fd = std::getenv(kControlFdVariable)) {
      fd_ = std::atoi(fd);
      if (fcntl(fd_, F_SETFL, fcntl(fd_, F_GETFL) | O_NONBLOCK) != 0) fd_ = -1;
    }
  }
  bool supported() const { return fd_ >= 0; }
  void begin(uint64_t id) { cancelled_.erase(cancelled_.begin(), cancelled_.lower_bound(id)); }
  bool cancelled(uint64_t id) {
    while (fd_ >= 0) {
      const ssize_t n = read(fd_, frame_ + filled_, sizeof frame_ - filled_);
      if (n <= 0) {
        if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) fd_ = -1;  // the server is gone
        break;
      }
      filled_ += n;
      if (filled_ == sizeof frame_) {
        uint64_t value = 0;
        for (int i = 7; i >= 0; --i) value = value << 8 | frame_[i];
        cancelled_.insert(value);
        filled_ = 0;
      }
    }
    return id != 0 && cancelled_.count(id) > 0;
  }

 private:
  int fd_ = -1;
  unsigned char frame_[8];
  size_t filled_ = 0;
  std::set<uint64_t> cancelled_;
};

class Worker {
 public:
  Worker(Pair& pair, const Text& text, std::string mode, int64_t block)
      : pair_(pair), text_(text), mode_(std::move(mode)), block_(block) {
    pair_.keep_resident();
  }

  void serve() {
    if (mode_ != "ar" && block_ == kAuto) pair_.cost_curve();  // before the first request, which would wait for it
    json ready = ready_fields(pair_);
    ready.update({{"max_named_sessions", kMaxSessions}, {"supports_cancel", control_.supported()}});
    send(ready);
    serve_requests(
        pair_, [this](const std::string& name, const json& request) { op(name, request); },
        [this](const json& request) { generate(request); });
  }

 private:
  void op(const std::string& op, const json& request) {
    const std::string id = field<std::string>(request, "session_id", "");
    if (id.empty()) throw RequestError("'" + op + "' needs a session_id", "invalid_request");
    if (op == "open") {
      admit(id);
      send({{"opened", true}, {"session_id", id}});
    } else if (op == "close" || op == "reset") {
      if (op == "close") drop(id);
      if (holder_ == id) pair_.forget();
      send({{op == "close" ? "closed" : "reset", true}, {"session_id", id}});
    } else {
      throw RequestError("unknown op '" + op + "'; send open, close, reset or cost_curve", "invalid_request");
    }
  }

  // A session to the front of the recent ones; a new one past kMaxSessions evicts the one idle longest (clients
  // that never close would fill the worker otherwise). Evicting loses nothing: the caches are the last
  // generation's whichever session it was, and a request resumes from them by its prompt alone (keep_resident).
  void admit(const std::string& id) {
    drop(id);
    if (recent_.size() >= kMaxSessions) {
      std::fprintf(stderr, "dflash_worker: session %s evicted (idle longest of %zu)\n", recent_.back().c_str(),
                   kMaxSessions);
      drop(std::string(recent_.back()));
    }
    sessions_[id] = recent_.insert(recent_.begin(), id);
  }

  void drop(const std::string& id) {
    if (const auto found = sessions_.find(id); found != sessions_.end()) {
      recent_.erase(found->second);
      sessions_.erase(found);
    }
  }

  void generate(const json& request) {
    const double t0 = now();
    const uint64_t cancel_id = field<uint64_t>(request, "cancel_request_id", 0);
    control_.begin(cancel_id);
    const std::string session = field<std::string>(request, "session_id", "");
    if (!session.empty()) admit(session);
    const std::vector<int64_t> ids = prompt_ids(request, &text_);
    const auto prompt_tokens = static_cast<int64_t>(ids.size());
    const int64_t context = pair_.limits().max_context_len;
    if (prompt_tokens == 0) throw RequestError("the prompt is empty", "invalid_request");
    if (prompt_tokens >= context) {
      throw RequestError("the prompt has " + std::to_string(prompt_tokens) + " tokens but the context holds " +
                         std::to_string(context) + "; shorten it (the programs were exported with export.max_seq_len " +
                         std::to_string(context) + ")", "context_length_exceeded");
    }
    const int64_t asked = field<int64_t>(request, "max_new_tokens", -1);
    const int64_t room = pair_.limits().reply_room(prompt_tokens);
    const int64_t max_new = asked > 0 ? std::min(asked, room) : room;
    Decoding d = decoding(request, mode_, block_, /*seed_as_given=*/false);
    const auto stops = field<std::vector<std::string>>(request, "stop", {});

    Sampler sampler(d.sampling);
    TextStream stream(text_, /*special=*/true);  // the server's filters and parsers read the family's markers
    std::string reply;
    bool stopped = false, cancelled = false;
    size_t kept = 0;  // tokens up to the one whose text completes a stop string: what completion_tokens counts
    const OnTokens on_tokens = [&](const std::vector<int64_t>& tokens) {
      std::string piece;  // one line per round, not per token; a token at a time to know where a stop string ends
      for (auto token = tokens.begin(); token != tokens.end() && !stopped; ++token, ++kept) {
        const std::string more = pair_.limits().eos_ids.count(*token) ? "" : stream.add({*token});
        piece += more;
        reply += more;
        for (const std::string& stop : stops) {
          const size_t from = reply.size() - std::min(reply.size(), more.size() + stop.size());
          stopped = stopped || (!stop.empty() && reply.find(stop, from) != std::string::npos);
        }
      }
      if (!piece.empty()) send({{"token", piece}});
      cancelled = control_.cancelled(cancel_id);
      return !stopped && !cancelled;
    };
    const Generation g = dflash::generate(pair_, d.mode, d.block, max_new, ids, sampler, on_tokens);
    holder_ = session;
    if (const std::string rest = stream.finish(); !rest.empty() && !stopped && !cancelled) send({{"token", rest}});

    std::vector<int64_t> generated(g.tokens.begin(), g.tokens.begin() + std::min(kept, g.tokens.size()));
    const bool eos = !generated.empty() && pair_.limits().eos_ids.count(generated.back());
    if (eos) generated.pop_back();
    double decode_s = 0;
    int64_t drafted = 0, verified = 0, accepted = 0, drafting = 0;
    for (const Round& r : g.rounds) {
      decode_s += r.total_s;
      drafted += r.drafted, verified += r.verified, accepted += r.accepted, drafting += r.verified > 0;
    }
    const double total_s = now() - t0;
    const auto made = static_cast<int64_t>(generated.size());
    const double tau = drafting ? static_cast<double>(accepted + drafting) / drafting : 0.0;
    const double decode_tok_s = decode_s > 0 ? (static_cast<double>(g.tokens.size()) - 1) / decode_s : 0.0;
    send({{"done", true},
          {"prompt_tokens", prompt_tokens},
          {"completion_tokens", made},
          {"finish_reason", eos || stopped || cancelled ? "stop" : "length"},  // or it ran to max_new
          {"reused_prompt_tokens", g.reused},
          {"prefilled_prompt_tokens", prompt_tokens - g.reused},
          {"session_reset_reason", g.resume},
          {"prefill_ms", 1000 * g.prefill_s},
          {"decode_ms", 1000 * decode_s},
          {"total_ms", 1000 * total_s},
          {"prefill_tok_s", g.prefill_s > 0 ? (prompt_tokens - g.reused) / g.prefill_s : 0.0},
          {"decode_tok_s", decode_tok_s},
          // a reply cut at a stop string or a cancellation is not what the client will send back next turn
          {"generated_token_ids", stopped || cancelled ? std::vector<int64_t>{} : generated},
          {"cancelled", cancelled},
          {"dflash", {{"rounds", g.rounds.size()}, {"drafted", drafted}, {"verified", verified},
                      {"accepted", accepted}, {"tau", tau}}}});
    std::fprintf(stderr,
                 "dflash_worker: session=%s prompt=%lld reused=%lld (%s) tokens=%lld rounds=%zu tau=%.2f "
                 "prefill_ms=%.1f decode_tok_s=%.1f%s\n",
                 session.empty() ? "-" : session.c_str(), static_cast<long long>(prompt_tokens),
                 static_cast<long long>(g.reused), g.resume.c_str(), static_cast<long long>(g.tokens.size()),
                 g.rounds.size(), tau, 1000 * g.prefill_s, decode_tok_s,
                 cancelled ? " cancelled" : stopped ? " stop string" : "");
  }

  Pair& pair_;
  const Text& text_;
  const std::string mode_;
  const int64_t block_;
  Control control_;
  std::list<std::string> recent_;  // the named sessions, most recently used first
  std::unordered_map<std::string, std::list<std::string>::iterator> sessions_;  // each one's place in recent_
  std::string holder_;  // the session whose conversation the caches hold ("": requests without one)
};

}  // namespace

void run_worker(Pair& pair, const Text& text, const std::string& mode, int64_t block) {
  Worker(pair, text, mode, block).serve();
}

}  // namespace dflash
