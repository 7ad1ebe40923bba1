#include "decode.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <numeric>

#include <nlohmann/json.hpp>

#include <executorch/extension/tensor/tensor_ptr_maker.h>

#include "lookup.h"
#include "metadata.h"
#include "rebuild.h"

namespace dflash {
namespace {

using executorch::aten::ScalarType;
using executorch::extension::from_blob;
namespace meta = metadata;

std::vector<int64_t> positions(int64_t start, int64_t length) {
  std::vector<int64_t> out(length);
  std::iota(out.begin(), out.end(), start);
  return out;
}

// Greedy verification (its host work) that accepts no proposal: each round moves one position on.
class AcceptNone : public Sampler {
 public:
  AcceptNone() : Sampler(Sampling{}) {}
  std::pair<int64_t, int64_t> verify(const std::vector<int64_t>& proposals, const std::vector<float>& q,
                                     const float* logits, int64_t vocab) override {
    return {0, argmax(logits, 1, vocab)[0]};
  }
};

// Whether the caches can go back to any position they hold, as export.json says: no ring (a sliding layer's cache
// under export.sliding_cache ring keeps its window and one call's rows) and no recurrent state (a hybrid's goes back
// only within its last call). Without export.json, no.
bool rewinds(const std::string& dir) {
  std::ifstream in(dir + "/export.json");
  const auto j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  const nlohmann::json::json_pointer ring("/config/sliding_cache"),
      recurrent("/programs/target/metadata/get_recurrent_state");
  return !j.is_discarded() && j.contains(ring) && j[ring] == "full" && j.contains(recurrent) && j[recurrent] == false;
}

}  // namespace

Pair::Pair(const std::string& dir) : rewinds_(rewinds(dir)) {
  const std::string ptd = dir + "/shared.ptd";
  if (is_file(ptd)) weights_ = std::make_unique<SharedWeights>(ptd);
  target_ = std::make_unique<Pte>(dir + "/target.pte", meta::kTargetMethod, weights_.get());
  if (is_file(dir + "/draft.pte")) {
    draft_ = std::make_unique<Pte>(dir + "/draft.pte", meta::kDraftMethod, weights_.get());
  } else if (target_->has(meta::kDraftMethod)) {  // export.layout single
    draft_ = std::make_unique<Pte>(*target_, meta::kDraftMethod, weights_.get());
  } else if (!target_->has(meta::kMaxBlockLen)) {  // only a target exported without a draft says its block
    throw UserError(dir + " has no draft.pte, and its target.pte no '" + meta::kDraftMethod +
                    "' method (export.layout single puts the draft there): " + kRebuild);
  }
  if (draft_ && (draft_->integer(meta::kTargetCheckpointId) != target_->integer(meta::kCheckpointId) ||
                 draft_->integers(meta::kTargetLayerIds) != target_->integers(meta::kTargetLayerIds))) {
    throw UserError(draft_->path() + " was exported for another target than " + target_->path() +
                    "; export both from the same pair");
  }
  const Pte& blocks = draft_ ? *draft_ : *target_;  // what says the longest block (programs.max_block_len)
  std::vector<int64_t> eos = target_->integers(meta::kEosIds);
  limits_ = {target_->integer(meta::kMaxContextLen), target_->integer(meta::kMaxSeqLen),
             draft_ ? draft_->integer(meta::kMaskTokenId) : 0, blocks.integer(meta::kMaxBlockLen),
             target_->integer(meta::kVocabSize), {eos.begin(), eos.end()},
             draft_ && draft_->has(meta::kContextWindow) ? draft_->integer(meta::kContextWindow) : 0,
             draft_ && draft_->has(meta::kSelectorTopK) ? draft_->integer(meta::kSelectorTopK) : 0,
             draft_ && draft_->has(meta::kVocabIds) ? draft_->integers(meta::kVocabIds) : std::vector<int64_t>{}};
  // without a draft: 0 for its fingerprint and size, as Engine.identity
  identity_ = programs_identity({target_->integer(meta::kCheckpointId),
                                 draft_ ? draft_->integer(meta::kDraftCheckpointId) : 0,
                                 limits_.max_context_len, limits_.max_block,
                                 static_cast<int64_t>(std::filesystem::file_size(target_->path())),
                                 draft_ ? static_cast<int64_t>(std::filesystem::file_size(draft_->path())) : 0});
}

const CostCurve& Pair::cost_curve(int64_t repeats) {
  if (!curve_) {
    curve_ = measure_cost_curve(repeats);
    resident_ = {};  // its prompts are no conversation's
  }
  return *curve_;
}

CostCurve Pair::measure_cost_curve(int64_t repeats) {
  CostSweep sweep(limits_.max_block, limits_.max_context_len, repeats);
  for (size_t start = 0; start < sweep.starts.size(); ++start) {
    for (int64_t n = 0; n < sweep.sweeps(); ++n) {
      Sweep plan = sweep.planner(n);
      AcceptNone sampler;
      const Generation out = decode(std::vector<int64_t>(sweep.starts[start], 0), sweep.tokens, limits_.max_block,
                                    sampler, &plan, {});
      std::vector<double> verify_s, draft_s;
      for (const Round& r : out.rounds) verify_s.push_back(r.verify_s), draft_s.push_back(r.draft_s);
      sweep.record(start, n, plan, verify_s, draft_s);
    }
  }
  return sweep.curve(identity_);
}

std::optional<Sampling> Pair::recommended() const {
  if (!target_->has(meta::kTemperature)) return std::nullopt;
  Sampling s;
  s.temperature = target_->real(meta::kTemperature);
  s.top_p = target_->real(meta::kTopP);
  s.top_k = target_->integer(meta::kTopK);
  return s;
}

void Pair::check(const std::vector<int64_t>& prompt, int64_t max_new_tokens) const {
  if (prompt.empty()) throw UserError("the prompt is empty; give at least one token");
  if (static_cast<int64_t>(prompt.size()) > limits_.max_context_len) {
    throw UserError("the prompt has " + std::to_string(prompt.size()) + " tokens but max_seq_len is " +
                    std::to_string(limits_.max_context_len) +
                    "; shorten the prompt or export with a larger export.max_seq_len");
  }
  if (max_new_tokens < 1) throw UserError("max_new_tokens must be at least 1, got " + std::to_string(max_new_tokens));
  for (int64_t t : prompt) {
    if (t < 0 || t >= limits_.vocab_size) {
      throw UserError("prompt token " + std::to_string(t) + " is outside the vocabulary (0.." +
                      std::to_string(limits_.vocab_size - 1) + ")");
    }
  }
}

void Pair::target(std::vector<int64_t> tokens, int64_t pos) {
  std::vector<int64_t> at = positions(pos, tokens.size());
  const auto n = static_cast<int32_t>(tokens.size());
  target_->call({*from_blob(tokens.data(), {1, n}, ScalarType::Long), *from_blob(at.data(), {n}, ScalarType::Long)});
}

void Pair::keep_taps(std::vector<float>& taps, int64_t rows) {
  const auto& hidden = target_->output(1);
  taps_width_ = hidden.size(2);
  const float* h = hidden.const_data_ptr<float>();
  taps.insert(taps.end(), h, h + rows * taps_width_);
}

int64_t Pair::prefill(const std::vector<int64_t>& prompt, int64_t start, std::vector<float>* taps, double& seconds,
                      Sampler& sampler) {
  const double t0 = now();
  for (size_t i = start; i < prompt.size(); i += limits_.chunk) {
    const size_t end = std::min(prompt.size(), i + limits_.chunk);
    target({prompt.begin() + i, prompt.begin() + end}, i);
    if (taps) keep_taps(*taps, end - i);
  }
  const auto& logits = target_->output(0);
  const int64_t first = sampler.next_token(logits.const_data_ptr<float>() + (logits.size(1) - 1) * logits.size(2),
                                           logits.size(2));
  seconds = now() - t0;
  return first;
}

int64_t Pair::reusable(const std::vector<int64_t>& prompt, bool draft, Generation& out) {
  const auto& held = resident_.tokens;
  size_t same = 0;
  while (same < held.size() && same < prompt.size() && held[same] == prompt[same]) ++same;
  out.resume = held.empty() ? "new" : same == held.size() && same < prompt.size() ? "exact_prefix"
                                    : same == prompt.size() ? "equal" : "mismatch";
  const bool back = same < held.size();  // the prompt leaves what the caches hold before its end
  out.reused = (draft && !resident_.draft) || (back && !rewinds_) ? 0 : std::min<int64_t>(same, prompt.size() - 1);
  return out.reused;
}

void Pair::keep(const std::vector<int64_t>& prompt, const Generation& out, std::vector<float> unseen,
                int64_t unseen_start, bool draft) {
  if (!keep_resident_) return;
  resident_.tokens = prompt;
  resident_.tokens.insert(resident_.tokens.end(), out.tokens.begin(), out.tokens.end() - 1);
  resident_.unseen = std::move(unseen);
  resident_.unseen_start = unseen_start;
  resident_.draft = draft;
}

Generation Pair::ar(const std::vector<int64_t>& prompt, int64_t max_new_tokens, Sampler& sampler,
                    const OnTokens& on_tokens) {
  check(prompt, max_new_tokens);
  Generation out;
  const int64_t start = reusable(prompt, false, out);
  resident_ = {};  // until this generation ends well
  out.tokens.push_back(prefill(prompt, start, nullptr, out.prefill_s, sampler));
  bool more = !on_tokens || on_tokens({out.tokens.back()});
  int64_t pos = prompt.size();  // position of out.tokens.back(), not yet written to the cache
  while (more && static_cast<int64_t>(out.tokens.size()) < max_new_tokens &&
         !limits_.eos_ids.count(out.tokens.back()) && pos < limits_.max_context_len) {
    const double t0 = now();
    target({out.tokens.back()}, pos);
    const double t1 = now();
    out.tokens.push_back(sampler.next_token(target_->output(0).const_data_ptr<float>(), limits_.vocab_size));
    ++pos;
    out.rounds.push_back({0, 0, 1, 0.0, t1 - t0, now() - t0, 0, false});
    more = !on_tokens || on_tokens({out.tokens.back()});
  }
  keep(prompt, out, {}, 0, false);
  return out;
}

Generation Pair::dflash(const std::vector<int64_t>& prompt, int64_t max_new_tokens, int64_t block,
                        Sampler& sampler, const OnTokens& on_tokens) {
  if (!draft_) return lookup(prompt, max_new_tokens, block, sampler, on_tokens);  // the programs' only proposals
  check(prompt, max_new_tokens);
  if (block == kAuto) {
    const bool plan = planned(true, sampler.greedy());
    if (plan && !planner_) planner_ = std::make_unique<AdaptivePlanner>(cost_curve(), limits_.max_block);
    return decode(prompt, max_new_tokens, limits_.max_block, sampler, plan ? planner_.get() : nullptr,
                  limits_.eos_ids, on_tokens, true, plan ? &lookup_planner() : nullptr);
  }
  check_block(block);
  return decode(prompt, max_new_tokens, block, sampler, nullptr, limits_.eos_ids, on_tokens);
}

Generation Pair::lookup(const std::vector<int64_t>& prompt, int64_t max_new_tokens, int64_t block, Sampler& sampler,
                        const OnTokens& on_tokens) {
  check(prompt, max_new_tokens);
  if (block == kAuto) {
    const bool plan = planned(true, sampler.greedy());
    return decode(prompt, max_new_tokens, limits_.max_block, sampler, nullptr, limits_.eos_ids, on_tokens, false,
                  plan ? &lookup_planner() : nullptr);
  }
  check_block(block);
  return decode(prompt, max_new_tokens, block, sampler, nullptr, limits_.eos_ids, on_tokens, false);
}

LookupPlanner& Pair::lookup_planner() {
  if (!lookup_planner_) lookup_planner_ = std::make_unique<LookupPlanner>(cost_curve(), limits_.max_block);
  return *lookup_planner_;
}

void Pair::check_block(int64_t block) const {
  if (block < 2 || block > limits_.max_block) {
    throw UserError("block size " + std::to_string(block) + " is outside 2.." + std::to_string(limits_.max_block) +
                    ", the blocks " + (draft_ ? draft_ : target_)->path() + " was exported for; give at most " +
                    std::to_string(limits_.max_block) + ", or auto");
  }
}

Generation Pair::decode(const std::vector<int64_t>& prompt, int64_t max_new_tokens, int64_t block, Sampler& sampler,
                        RoundPlanner* planner, const std::set<int64_t>& eos, const OnTokens& on_tokens,
                        bool drafted, LookupPlanner* lookup_planner) {
  Generation out;
  std::vector<float> unseen;  // target taps the draft has not been fed, from unseen_start
  const int64_t start = reusable(prompt, drafted, out);
  int64_t unseen_start = std::min(start, resident_.unseen_start);
  if (drafted && start > resident_.unseen_start) {  // the draft is fed the rest of the taps it lacks first
    unseen.assign(resident_.unseen.begin(), resident_.unseen.begin() + (start - unseen_start) * taps_width_);
  }
  resident_ = {};  // until this generation ends well
  out.tokens.push_back(prefill(prompt, start, drafted ? &unseen : nullptr, out.prefill_s, sampler));
  int64_t pos = prompt.size();  // position of out.tokens.back(), not yet written to the cache
  bool done = eos.count(out.tokens.back()) > 0 || (on_tokens && !on_tokens({out.tokens.back()}));
  std::vector<int64_t> block_ids, context;
  const bool lookups = !drafted || lookup_planner;
  std::vector<int64_t> history;  // the prompt and the tokens so far, grown as they come: what lookup searches
  if (lookups) {
    history.assign(prompt.begin(), prompt.end());
    history.insert(history.end(), out.tokens.begin(), out.tokens.end());
  }
  std::vector<float> q;       // the distributions sampled proposals were drawn from
  std::vector<float> scores;  // a DFlash2 draft's: the scores its path was chosen from [b - 1, top-k]
  while (!done) {
    const int64_t room = std::min({block, max_new_tokens - static_cast<int64_t>(out.tokens.size()),
                                   limits_.max_context_len - pos});
    if (room < 1) break;
    const double t0 = now();
    const int64_t b = planner ? planner->block(pos, room) : room;
    const int64_t last = out.tokens.back();
    std::vector<int64_t> proposals;
    double draft_s = 0;
    int64_t drafted_count = b - 1;
    bool looked_up = !drafted;  // lookup proposals: point masses, verified as argmax proposals (q empty)
    if (room >= 2 && lookups) {
      const Lookup found = dflash::lookup(history.data(), history.size(), room - 1);
      int64_t count = found.tokens.size();
      if (!looked_up && count) {  // auto with the draft: lookup takes the round where it pays more
        count = lookup_round(dynamic_cast<AdaptivePlanner&>(*planner), *lookup_planner, found.ngram, count, pos);
        looked_up = count > 0;
      } else if (lookup_planner && count) {
        count = lookup_planner->verify_count(found.ngram, count, pos);
      }
      if (looked_up) {
        proposals.assign(found.tokens.begin(), found.tokens.begin() + count);
        q.clear();
        drafted_count = found.tokens.size();
      }
    }
    // A block of one is a plain target step: the unseen taps wait for the next round. Without a draft, only the
    // cost sweep gets here: proposals (token 0) that cost nothing (cost_curve._no_draft) time the target's verifies.
    if (b >= 2 && !looked_up && !draft_) {
      proposals.assign(b - 1, 0);
    } else if (b >= 2 && !looked_up) {
      block_ids.assign(b, limits_.mask_token_id);
      block_ids[0] = last;
      if (limits_.context_window) {  // taps the windowed draft would never read stay out (generate_dflash)
        const int64_t unread = std::max<int64_t>(pos - limits_.context_window + 1 - unseen_start, 0);
        unseen.erase(unseen.begin(), unseen.begin() + unread * taps_width_);
        unseen_start += unread;
      }
      const auto n = static_cast<int32_t>(unseen.size() / taps_width_);
      context = positions(unseen_start, n);
      const double t1 = now();
      draft_->call({*from_blob(block_ids.data(), {1, static_cast<int32_t>(b)}, ScalarType::Long),
                       *from_blob(unseen.data(), {1, n, static_cast<int32_t>(taps_width_)}, ScalarType::Float),
                       *from_blob(context.data(), {n}, ScalarType::Long)});
      draft_s = now() - t1;
      if (limits_.selector_top_k) {  // DFlash2: the path is walked whole, its scores are its confidence
        const auto& candidates = draft_->output(0);
        const Lattice lattice{candidates.const_data_ptr<int64_t>(), draft_->output(1).const_data_ptr<float>(),
                              draft_->output(2).const_data_ptr<float>(), candidates.size(0), candidates.size(1)};
        proposals = sampler.walk(lattice, limits_.vocab_size, q, scores);
        const int64_t k = planner ? planner->verify_count(scores.data(), b - 1, lattice.k, pos) : b - 1;
        proposals.resize(k);
        q.resize(q.empty() ? 0 : k * limits_.vocab_size);
      } else {
        const auto& logits = draft_->output(0);
        const float* rows = logits.const_data_ptr<float>();
        const int64_t k = planner ? planner->verify_count(rows, b - 1, logits.size(2), pos) : b - 1;
        proposals = sampler.propose(rows, k, logits.size(2), q);
        if (!limits_.vocab_ids.empty()) to_vocab(limits_.vocab_ids, limits_.vocab_size, proposals, q);
      }
      unseen.clear();
      unseen_start = pos;
    }
    std::vector<int64_t> tokens{last};
    tokens.insert(tokens.end(), proposals.begin(), proposals.end());
    const double t1 = now();
    target(tokens, pos);
    const double verify_s = now() - t1;
    const auto [accepted, following] =
        sampler.verify(proposals, q, target_->output(0).const_data_ptr<float>(), limits_.vocab_size);
    if (looked_up) {
      if (lookup_planner) lookup_planner->observe(proposals.size(), accepted);
      if (planner) dynamic_cast<AdaptivePlanner&>(*planner).taken(accepted);
    } else if (planner) {
      planner->observe(proposals.size(), accepted);
    }
    std::vector<int64_t> emitted(proposals.begin(), proposals.begin() + accepted);
    emitted.push_back(following);
    for (size_t i = 0; i < emitted.size(); ++i) {
      if (eos.count(emitted[i])) {
        emitted.resize(i + 1);
        done = true;
        break;
      }
    }
    out.tokens.insert(out.tokens.end(), emitted.begin(), emitted.end());
    if (lookups) history.insert(history.end(), emitted.begin(), emitted.end());
    if (drafted) keep_taps(unseen, accepted + 1);  // of `last` and the accepted proposals
    pos += accepted + 1;
    out.rounds.push_back({static_cast<int64_t>(proposals.size()), accepted, static_cast<int64_t>(emitted.size()),
                          draft_s, verify_s, now() - t0, drafted_count, looked_up});
    if (on_tokens && !on_tokens(emitted)) done = true;
  }
  keep(prompt, out, std::move(unseen), unseen_start, drafted);
  return out;
}

Generation generate(Pair& pair, const std::string& mode, int64_t block, int64_t max_new_tokens,
                    const std::vector<int64_t>& prompt, Sampler& sampler, const OnTokens& on_tokens) {
  if (mode == "ar") return pair.ar(prompt, max_new_tokens, sampler, on_tokens);
  if (mode != "dflash" && mode != "lookup") throw UserError("mode must be ar, dflash or lookup, got '" + mode + "'");
  block = block ? block : pair.limits().max_block;
  if (mode == "lookup") return pair.lookup(prompt, max_new_tokens, block, sampler, on_tokens);
  return pair.dflash(prompt, max_new_tokens, block, sampler, on_tokens);
}

}  // namespace dflash
