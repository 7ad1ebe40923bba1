// Choosing tokens: greedy, or sampling with the speculative-sampling rule that keeps DFlash exact. The
// same algorithm as dflash_et/runtime/sampling.py (temperature, then top-k, then top-p; a proposal x is
// accepted with probability min(1, p(x) / q(x)), else the next token is drawn from normalize(max(0, p - q));
// argmax proposals have q one-hot; a DFlash2 draft's proposals are its walk through a candidate lattice), with
// this runner's own seeded generator: a seed fixes the tokens of the C++ runner, not the same tokens as the
// Python engine's (torch's generator).
#pragma once

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

namespace dflash {

struct Sampling {
  double temperature = 0;  // 0: greedy (the other fields then do nothing)
  double top_p = 1;
  int64_t top_k = 0;       // 0: no top-k
  bool sample_proposals = false;  // the draft's proposals at temperature > 0: sampled from it, or its argmax
  uint64_t seed = 0;
};

// A DFlash2 draft's candidate lattice over `positions` proposal positions (sampling.Lattice), viewing the draft's
// outputs: `candidates` and their logits `unary` [positions, k]; `pair` [positions, k, k], pair[p][j][i] the score
// of candidate i of position p after candidate j of position p - 1 (at p = 0 after the anchor: alike for every j).
struct Lattice {
  const int64_t* candidates;
  const float* unary;
  const float* pair;
  int64_t positions, k;
};

class Sampler {
 public:
  explicit Sampler(const Sampling& sampling);
  virtual ~Sampler() = default;
  bool greedy() const { return sampling_.temperature == 0; }

  // A token from one row of logits (plain decoding, and the token after prefill).
  int64_t next_token(const float* logits, int64_t vocab);
  // Proposals from the draft's logits [rows, vocab]; `q` gets the distributions they were drawn from
  // (left empty for argmax proposals).
  std::vector<int64_t> propose(const float* logits, int64_t rows, int64_t vocab, std::vector<float>& q);
  // A DFlash2 draft's proposals: its path through `lattice` (sampling.walk), each position's candidate chosen
  // after the one chosen before it (the anchor first): the best-scoring for argmax proposals, drawn from
  // softmax(score / temperature) over the k candidates for sampled ones, `q` [positions, vocab] then those
  // distributions on the vocabulary, so that verify's rule stays exact (left empty for argmax: one-hot).
  // `scores` [positions, k] gets the scores each choice was made from: auto reads its confidence there.
  std::vector<int64_t> walk(const Lattice& lattice, int64_t vocab, std::vector<float>& q, std::vector<float>& scores);
  // (accepted, next): how many proposals the target's logits [proposals + 1, vocab] accept, and the token after them.
  virtual std::pair<int64_t, int64_t> verify(const std::vector<int64_t>& proposals, const std::vector<float>& q,
                                             const float* logits, int64_t vocab);

 private:
  void distribution(const float* logits, int64_t vocab, std::vector<float>& probs) const;
  int64_t draw(const std::vector<float>& probs);
  double uniform();

  Sampling sampling_;
  std::mt19937_64 generator_;
  std::vector<float> p_, rest_;
};

// A reduced draft head's proposals (indices into its logits) as the token ids `ids` of those logits, and their q
// [rows, ids.size()] (if any) spread over the vocabulary of `vocab` tokens, zero elsewhere (Sampler.propose).
void to_vocab(const std::vector<int64_t>& ids, int64_t vocab, std::vector<int64_t>& proposals, std::vector<float>& q);
// Row-wise argmax of [rows, vocab] floats, the first index on ties (as numpy and torch).
std::vector<int64_t> argmax(const float* logits, int64_t rows, int64_t vocab);

}  // namespace dflash
