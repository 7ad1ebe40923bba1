// Lookup proposals: drafts that need no model. A reply after a document, a rewrite, a code edit or a later turn
// repeats long runs of its context, so the tokens that followed the latest earlier occurrence of the context's last
// n tokens are a proposal (prompt lookup decoding; llama.cpp's ngram-simple). n is tried from kMaxNgram down to
// kMinNgram: the longest recurring suffix is the likeliest to go on alike. A proposal is one token per position, a
// point mass, so the verify rule treats it as an argmax proposal (q one-hot): greedy and sampled output stay exact.
#pragma once

#include <cstdint>
#include <vector>

#include "cost_curve.h"
#include "planner.h"

namespace dflash {

constexpr int64_t kMinNgram = 2;  // a lone recurring token proposes mostly noise
constexpr int64_t kMaxNgram = 8;

struct Lookup {
  std::vector<int64_t> tokens;  // the proposals
  int64_t ngram = 0;            // the length of the recurring suffix they follow (0: none recurs)
};

// Up to `max_tokens` tokens that followed the latest earlier occurrence of the longest recurring suffix of
// `context` (n from kMaxNgram down to kMinNgram); none where no such suffix recurs.
Lookup lookup(const int64_t* context, int64_t length, int64_t max_tokens);

// Which lookup proposals a greedy `auto` round verifies (`block_size: auto` with lookup proposals; the one rule of
// both runners, as planner.h's for a draft's). Verifying k proposals costs a target call of k + 1 tokens on this
// device (`CostCurve`, at the round's cache position) and emits E(k) tokens on average (planner.h), a_1 being how
// often the target accepted the first proposal after a match of the same n-gram length, and a_2 = a_3 = ... how often
// it accepted a later one once it accepted the one before: a copied run tends to go on, so what the first positions
// show holds for those not verified yet. Both are counted online from a prior try each (1/2 and 4/5), older rounds
// discounted by `kMemory` per round of that length, so that they follow text that stops repeating within tens of
// rounds. A round verifies the k with the most tokens per ms; k = 0, a plain step, is what the proposals of a
// length that does not pay get. Of every kProbeGap proposals of a length it declines in a row, it still verifies the
// next one's first token, so a length that starts paying again is seen: what does not pay costs at most a call of 2
// tokens in kProbeGap plain steps. k depends on past rounds and the curve alone, never on the tokens a round samples,
// so greedy output is plain decoding's (sampled, lookup keeps its block, as a draft does: planned()).
class LookupPlanner {
 public:
  static constexpr int64_t kProbeGap = 16;
  static constexpr double kMemory = 0.95;
  LookupPlanner(CostCurve curve, int64_t max_block);
  // How many of `proposed` proposals that follow a recurring suffix of `ngram` tokens to verify at `pos`.
  int64_t verify_count(int64_t ngram, int64_t proposed, int64_t pos);
  // What the target accepted of the proposals verify_count last chose.
  void observe(int64_t verified, int64_t accepted);
  // The tokens per ms on the curve of verify_count's last choice.
  double rate() const { return rate_; }

 private:
  struct Rates {  // discounted (accepted, tried) counts, each from one prior try
    double first_accepted = 0.5, first_tried = 1, next_accepted = 0.8, next_tried = 1;
    int64_t declined = 0;  // proposals declined in a row
  };

  CostCurve curve_;
  int64_t max_block_;
  std::vector<Rates> rates_;  // [ngram - kMinNgram]
  Rates* last_ = nullptr;     // of the ngram verify_count last saw
  double rate_ = 0;
};

// `auto` with a draft and lookup proposals both (greedy): how many of the `proposed` lookup proposals after a
// recurring suffix of `ngram` tokens take the round `planner` planned at `pos` from the draft: those `lookup` would
// verify, where they give more tokens per ms than the round planned (a draft's block or a plain step); 0: the
// planner's round goes ahead. A round lookup takes calls no draft, and its taps wait for the next draft call.
int64_t lookup_round(AdaptivePlanner& planner, LookupPlanner& lookup, int64_t ngram, int64_t proposed, int64_t pos);

}  // namespace dflash
