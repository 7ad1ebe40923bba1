// Plain and DFlash decoding (greedy or sampled) over the two programs: the Python engine's loops
// (dflash_et/runtime/generate.py), round for round, so that both emit the same tokens.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "lookup.h"
#include "planner.h"
#include "programs.h"
#include "sampling.h"

namespace dflash {

inline constexpr int64_t kAuto = -1;  // a block size: `auto`, each round's block the planner's

// Everything a runner needs to know, read from the programs' constant methods.
struct Limits {
  int64_t max_context_len, chunk, mask_token_id, max_block, vocab_size;
  std::set<int64_t> eos_ids;
  int64_t context_window = 0;  // a draft whose every layer is windowed reads no tap older than this (0: none)
  // The most tokens a reply to a prompt of this length can have: the last is never written to the cache, so the
  // decode loops end at max_context_len - prompt + 1 (what a request without max_new_tokens gets).
  int64_t reply_room(int64_t prompt_tokens) const { return max_context_len - prompt_tokens + 1; }
  int64_t selector_top_k = 0;  // a DFlash2 draft's candidates per position: it returns a lattice (0: logits)
  std::vector<int64_t> vocab_ids;  // a reduced draft head: its logits are these tokens' (empty: the vocabulary's)
};

// One decode step: a DFlash round, or one plain token (verified = 0); times in seconds.
struct Round {
  int64_t verified, accepted, emitted;
  double draft_s, verify_s, total_s;
  int64_t drafted;
  bool looked_up;  // its proposals were lookup's (without a draft, or taken from it: auto)
};

struct Generation {
  std::vector<int64_t> tokens;
  double prefill_s = 0;
  std::vector<Round> rounds;
  int64_t reused = 0;   // prompt tokens whose cache entries a previous generation left (keep_resident)
  std::string resume;   // why that many (llm_server's warm-resume reasons): new (nothing held), exact_prefix (all held
                        // was the prompt's start), equal (the prompt lies wholly in what was held), mismatch
};

// Called with each step's new tokens as they are accepted (the first from the prompt's logits, then each round's);
// returns whether to go on (false: the generation ends there, as at EOS).
using OnTokens = std::function<bool(const std::vector<int64_t>&)>;

// target.pte and draft.pte (or target.pte alone, holding both), checked to be a pair, with the limits they carry.
class Pair {
 public:
  Pair(const std::string& programs_dir);
  const Limits& limits() const { return limits_; }
  // The checkpoint's recommended sampling, as target.pte carries it (none from programs exported before it did).
  std::optional<Sampling> recommended() const;

  // Plain decoding: one target call per token.
  Generation ar(const std::vector<int64_t>& prompt, int64_t max_new_tokens, Sampler& sampler,
                const OnTokens& on_tokens = nullptr);
  // DFlash with blocks of `block` (last token + proposals), clamped at the ends as the Python engine does, or
  // kAuto: greedy, the planner's blocks (it learns across generations); sampled, the largest block, as
  // Engine.dflash (a seed must give the same tokens on every run, whatever the planner learned).
  Generation dflash(const std::vector<int64_t>& prompt, int64_t max_new_tokens, int64_t block, Sampler& sampler,
                    const OnTokens& on_tokens = nullptr);
  // Lookup proposals (lookup.h) in blocks of at most `block` (as dflash's), target.pte alone: generate_dflash
  // without a draft; kAuto: greedy, the lookup planner's choice of them to verify (learning across generations),
  // sampled, the largest block.
  Generation lookup(const std::vector<int64_t>& prompt, int64_t max_new_tokens, int64_t block, Sampler& sampler,
                    const OnTokens& on_tokens = nullptr);

  // From now on a generation starts from what the caches still hold of the last one: the prompt's longest prefix
  // that the last generation's prompt and tokens share is not run again (the draft's context cache follows); where
  // the caches cannot go back (a ring, a recurrent state), only all of them, by a prompt that goes on past them.
  void keep_resident() { keep_resident_ = true; }
  // The caches hold nothing reusable (a session reset, or another conversation).
  void forget() { resident_ = {}; }

  // auto's cost curve: the one in `path` (checked to be of these programs), from now on.
  void load_cost_curve(const std::string& path) { curve_ = CostCurve::load(path, identity_); }
  // auto's cost curve: the one loaded, or measured now (once), as Engine.cost_curve.
  const CostCurve& cost_curve(int64_t repeats = 5);

 private:
  void check(const std::vector<int64_t>& prompt, int64_t max_new_tokens) const;
  void check_block(int64_t block) const;  // a fixed block: 2..the largest the programs were exported for
  LookupPlanner& lookup_planner();  // greedy auto's of lookup proposals, made on first use
  // The DFlash loop (generate_dflash): blocks of `block`, or the planner's of at most `block`; it stops at `eos`
  // and hands each step's new tokens to `on_tokens`. Not `drafted`: lookup proposals, the draft untouched, of which
  // `lookup_planner` (if any) chooses those to verify.
  Generation decode(const std::vector<int64_t>& prompt, int64_t max_new_tokens, int64_t block, Sampler& sampler,
                    RoundPlanner* planner, const std::set<int64_t>& eos, const OnTokens& on_tokens = nullptr,
                    bool drafted = true, LookupPlanner* lookup_planner = nullptr);
  // cost_curve.measure_cost_curve: decoding rounds of every block timed at the start, middle and end of the cache.
  CostCurve measure_cost_curve(int64_t repeats);
  // Runs the prompt from position `start` through the target in chunks; returns the first token and appends the
  // taps to `taps` (null: plain decoding, which feeds no draft).
  int64_t prefill(const std::vector<int64_t>& prompt, int64_t start, std::vector<float>* taps, double& seconds,
                  Sampler& sampler);
  // How many of the prompt's first tokens the caches hold (keep_resident; at most all but the last, whose logits
  // the first token needs), recorded in `out`; `draft`: the draft's cache must hold their taps too.
  int64_t reusable(const std::vector<int64_t>& prompt, bool draft, Generation& out);
  // What the caches hold after `out`: the prompt and every token but the last (not yet run), and the taps the
  // draft was not fed (of positions unseen_start..).
  void keep(const std::vector<int64_t>& prompt, const Generation& out, std::vector<float> unseen,
            int64_t unseen_start, bool draft);
  // The target on `tokens` at positions pos..; its outputs stay readable until the next call.
  void target(std::vector<int64_t> tokens, int64_t pos);
  // Appends the first `rows` rows of the last target call's taps to `taps`.
  void keep_taps(std::vector<float>& taps, int64_t rows);

  std::unique_ptr<SharedWeights> weights_;
  std::unique_ptr<Pte> target_, draft_;
  Limits limits_;
  int64_t taps_width_ = 0;  // k * hidden: the width of one position's taps
  std::string identity_;  // which programs these are, for a cost curve measured on them (Engine.identity)
  std::optional<CostCurve> curve_;
  std::unique_ptr<AdaptivePlanner> planner_;  // greedy auto's, made on first use
  std::unique_ptr<LookupPlanner> lookup_planner_;
  struct Resident {
    std::vector<int64_t> tokens;  // in the target's cache at positions 0..
    std::vector<float> unseen;    // taps of positions unseen_start.. the draft's cache lacks
    int64_t unseen_start = 0;
    bool draft = false;           // the draft's cache holds the taps of positions 0..unseen_start
  } resident_;
  bool keep_resident_ = false;
  const bool rewinds_;  // the caches can go back to any position they hold (else a request resumes only past them)
};

// One generation by the mode's name, as the runner's flags and the worker's requests give it: "ar", "dflash" (block
// 0: the largest the draft takes; kAuto: auto) or "lookup" (the same blocks).
Generation generate(Pair& pair, const std::string& mode, int64_t block, int64_t max_new_tokens,
                    const std::vector<int64_t>& prompt, Sampler& sampler, const OnTokens& on_tokens = nullptr);

}  // namespace dflash
