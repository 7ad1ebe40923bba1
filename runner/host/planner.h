// Adaptive verify length (`block_size: auto`): how many proposals each round drafts and verifies. The one
// planner of both runners: the C++ runner calls it directly, the Python engine through the host library's C API
// (host_api.cpp, dflash_et/runtime/native.py), so a rule changes here alone.
//
// A round that drafts a block of B and verifies its first k proposals costs draft(B) + target(k + 1) on this
// device (`CostCurve`, measured once, at the round's cache position) and emits on average
//     E(k) = 1 + a_1 + a_1 a_2 + ... + a_1 a_2 ... a_k
// tokens, a_i being the chance the target accepts proposal i once it accepted those before it.
// - Per round, the draft's probability of its top token at each position, through `Calibration` (learned online
//   from what the target accepts), gives a_i, and the round verifies the k with the most expected tokens per ms,
//   its draft call included.
// - The block B is the one that would have given the most tokens per ms over the last rounds, judged by what the
//   target accepted in them; it is decided anew every 4th round. A generation's first round (its opening) takes
//   the block its last openings would have done best with: there the reply often goes as the prompt leads, so one
//   block for all rounds is too short for openings or too long for the rest (docs/measurements.md#adaptive-planner).
// - When both the last few rounds and the window say a plain target step (B = 1) gives more, it decodes plainly
//   and probes the draft again after 2, 4, ... 32 plain steps, each stretch as many times longer as the probe
//   before it cost beyond the plain steps it stood for (a probe after a long prompt makes the draft read all of it
//   first): a draft that never helps costs at most a 32nd of decoding's time, and one that starts helping again
//   is back as soon as the last few rounds say so. A few bad rounds in a row alone do not stop it.
// - All it learns of the draft is kept per band of context (`band_of` the position a generation opens at,
//   doubling): a draft trained on short chats accepts nothing after a document, and one state for both let long
//   prompts draft on what short ones had earned while short ones fell back after them
//   (docs/measurements.md#auto-per-band-of-context-2026-12-05). A band not seen yet starts from the nearest seen.
// k depends on the draft's probabilities only, never on the tokens a round samples, so verifying any prefix keeps
// DFlash exact. Decisions use the cost curve plus what rounds take beyond it (learned from their wall times), so
// they vary from run to run; the tokens do not.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cost_curve.h"
#include "round_planner.h"

namespace dflash {

// E(k) for k = 0..n: tokens a round emits on average when it verifies the first k of n proposals.
std::vector<double> expected_tokens(const std::vector<double>& acceptance);

// Whether a generation is planned round by round: greedy auto. Sampled, auto keeps the largest block: its
// choices (device timings, what it learned) would decide which random draws a round makes, and a seed must give
// the same tokens on every run.
bool planned(bool is_auto, bool greedy);

// P(the target accepts a proposal | the draft's confidence there), by bins of that confidence, learned online.
// Each bin starts from `prior_weight` pseudo-observations at its own centre (a calibrated draft); what rounds show
// is discounted by `memory` per round, so that it follows a draft that goes from right to wrong (another kind of
// text) within tens of rounds, not hundreds.
class Calibration {
 public:
  explicit Calibration(int bins = 10, double prior_weight = 1.0, double memory = 0.95);
  std::vector<double> operator()(const std::vector<double>& confidence) const;
  void observe(const std::vector<double>& confidence, int64_t accepted);

 private:
  size_t bin(double confidence) const;

  std::vector<std::pair<double, double>> prior_;  // (accepted, tried) pseudo-observations per bin
  std::vector<double> accepted_, tried_, rate_;
  double memory_;
};

// E(k) rows of the last `size` rounds, summed over all of them (total) and over the last `react` (lately),
// starting from one prior row (what the planner believes before any round), so that the first rounds it sees
// weigh as much as they say: from a full window of prior rows, a draft that never accepted in a new context drafted
// tens of rounds before the window let it stop. A prior `borrowed` from another band is replaced by the first row.
class Window {
 public:
  Window(const std::vector<double>& row, size_t size, size_t react);
  void add(const std::vector<double>& row);
  std::vector<double> mean() const;
  std::vector<double> total, lately;
  size_t size, react;
  bool borrowed = false;  // the prior row is another band's

 private:
  std::deque<std::vector<double>> rows_;
};

// Bands of context: band 0 holds generations opening below kBand, band i those at kBand * [2^(i-1), 2^i).
constexpr int64_t kBand = 128;
int64_t band_of(int64_t pos);

// What the planner knows of the draft in one band of context: how often the target accepts its proposals (by
// confidence and by position), the windows of rounds (openings and later ones), and whether it is falling back.
struct Band {
  Band(Calibration calibration, std::vector<double> position_rate, const std::vector<double>& later,
       const std::vector<double>& openings, size_t window, size_t react, int64_t chosen);
  // A band not seen yet, started from this one: its windows hold this one's means until its first round.
  Band seeded() const;

  Calibration calibration;
  std::vector<double> position_rate;
  Window later, openings;
  int64_t chosen, probe_gap = 2, plain_left = 0;
  bool falling_back = false;
};

// Per-round choices for one stream of generations, learning across them (the rules at the top of this file).
// Reading the draft's confidence costs host time (a softmax over the vocabulary, CostCurve::confidence_ms): while
// choosing k has lately saved less than that, a round verifies all its proposals, and only probes and every 8th
// round read it. A round that ends its generation (end of text, max tokens) is counted once the next round shows
// it did: a longer block would have emitted nothing more there.
class AdaptivePlanner : public RoundPlanner {
 public:
  static constexpr size_t kWindow = 32;         // rounds a band's window holds
  static constexpr size_t kReact = 4;           // of them, the last few ("lately")
  static constexpr int64_t kMaxProbeGap = 32;   // most plain steps between probes while falling back
  static constexpr double kTimeWeight = 0.05;   // how fast per_call follows the rounds' wall times
  // `time_weight` 0 plans by the curve alone (tests that give it rounds, not times).
  AdaptivePlanner(CostCurve curve, int64_t max_block, double time_weight = kTimeWeight);
  int64_t block(int64_t pos, int64_t room) override;
  int64_t verify_count(const float* logits, int64_t rows, int64_t vocab, int64_t pos) override;
  // The round's wall time is the time since block().
  void observe(int64_t verified, int64_t accepted) override;
  void observe(int64_t verified, int64_t accepted, double seconds);
  // Tokens per ms the round block() chose is expected to give on the curve (its window's mean E; a plain step's
  // 1 / its cost): what lookup proposals must beat to take the round instead (lookup.h, lookup_round).
  double expected_rate();
  // The round block() chose went to lookup proposals instead, of which the target accepted `accepted`: the
  // generation goes on past them, as after a plain step (no draft call, nothing learned of the draft).
  void taken(int64_t accepted) { next_pos_ = pos_ + accepted + 1; }
  // What it learned as numbers (ms): what choosing k saves lately, and what a call costs beyond the curve.
  double saving() const { return saving_; }
  double per_call() const { return per_call_; }

 private:
  // The last round's row, kept until the next round shows whether the generation went on (commit).
  struct Pending {
    int64_t accepted;
    std::vector<double> row;
    bool opening;
  };
  using Costs = std::pair<std::vector<double>, std::vector<double>>;  // (target T = 1.., draft B = 1.. (0 at 1))

  const Costs& cost(int64_t pos);
  double round_ms(int64_t pos, int64_t block, int64_t verified);
  // 2 + the b in 0..count-1 with the most tokens per ms, total[b + 1] / cost[b + 1] (the first on ties, as max()).
  static int64_t best_block(const std::vector<double>& total, const std::vector<double>& cost, int64_t count);
  int64_t later_block(int64_t pos, int64_t room);
  Band& band_at(int64_t pos);
  void commit(bool ended);

  CostCurve curve_;
  int64_t max_block_;
  std::map<int64_t, Band> bands_;  // those seen, by band_of
  Band first_;                     // the stream's first band until a generation opens
  Band* band_;                     // the current generation's
  int64_t rounds_ = 0;
  bool opening_ = false, probing_ = false, rejected_ = false;
  std::vector<double> confidence_, acceptance_;
  int64_t pos_ = 0, block_ = 1, next_pos_ = 0, planned_ = 1;
  double saving_, per_call_ = 0, time_weight_, started_ = 0;
  std::optional<Pending> pending_;
  std::map<int64_t, Costs> costs_;
};

}  // namespace dflash
