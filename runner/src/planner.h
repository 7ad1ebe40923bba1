// block_size: auto in the C++ runner: dflash_et/runtime/adaptive.py's planner, ported rule for rule (the
// same constants, the same order of operations, in doubles as Python's floats are), so that on the same
// rounds both choose the same blocks and verify counts (tests/test_runner.py drives the two in lockstep,
// this one through planner_check.cpp). adaptive.py's docstrings say why each rule is what it is.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace dflash {

// Seconds on a steady clock (every timing of the runner).
double now();

// Milliseconds per program call on one device, at a few cache positions, interpolated between them as
// np.interp does (cost_curve.CostCurve; the same JSON file, reports/cost_curve.json).
struct CostCurve {
  std::vector<int64_t> positions;
  std::vector<std::vector<double>> target_ms;  // [position][T - 1]: a target call of T = 1..max_block tokens
  std::vector<std::vector<double>> draft_ms;   // [position][B - 2]: a draft call with a block of B = 2..max_block
  std::string programs;                        // which programs were timed (Pair::identity)
  double confidence_ms = 0;                    // reading the draft's confidence in a block of max_block

  int64_t max_block() const { return target_ms[0].size(); }
  double target(int64_t tokens, int64_t pos) const;
  double draft(int64_t block, int64_t pos) const;
  std::string to_json() const;  // exact: doubles with 17 digits
  // The curve in `path`, checked to be of `programs`; UserError (one line) otherwise.
  static CostCurve load(const std::string& path, const std::string& programs);
};

// The draft's probability of its top token in each row of its logits [rows, vocab].
std::vector<double> confidence(const float* logits, int64_t rows, int64_t vocab);
// Per length, the mean of the middle half of its times, then no length dearer than a longer one
// (cost_curve._typical).
std::vector<double> typical(const std::vector<std::vector<double>>& times);
// E(k) for k = 0..n: tokens a round emits on average when it verifies the first k of n proposals.
std::vector<double> expected_tokens(const std::vector<double>& acceptance);

// Chooses each round's block and how many proposals to verify (generate.py's Planner): Pair::dflash asks
// block() before a round, verify_count() once the draft proposed, observe() once the target verified.
class RoundPlanner {
 public:
  virtual ~RoundPlanner() = default;
  virtual int64_t block(int64_t pos, int64_t room) = 0;  // the draft block (1: a plain step), at most room
  virtual int64_t verify_count(const float* logits, int64_t rows, int64_t vocab, int64_t pos) = 0;
  virtual void observe(int64_t verified, int64_t accepted) = 0;
};

// P(the target accepts a proposal | the draft's confidence there), by bins, learned online (adaptive.Calibration).
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
// starting from one prior row, which the first row replaces when it is `borrowed` (adaptive._Window).
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

// What the planner knows of the draft in one band of context (adaptive._Band).
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

// adaptive.AdaptivePlanner: per-round choices for one stream of generations, learning across them.
class AdaptivePlanner : public RoundPlanner {
 public:
  AdaptivePlanner(CostCurve curve, int64_t max_block, size_t window = 32, size_t react = 4, int64_t max_probe_gap = 32,
                  double time_weight = 0.05);
  int64_t block(int64_t pos, int64_t room) override;
  int64_t verify_count(const float* logits, int64_t rows, int64_t vocab, int64_t pos) override;
  // The round's wall time is the time since block().
  void observe(int64_t verified, int64_t accepted) override;
  void observe(int64_t verified, int64_t accepted, double seconds);
  // What it learned as numbers (ms): what choosing k saves lately, and what a call costs beyond the curve.
  double saving() const { return saving_; }
  double per_call() const { return per_call_; }

 private:
  // What adaptive.py's _commit keeps until the next round shows whether the generation went on.
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
  int64_t rounds_ = 0, max_probe_gap_;
  bool opening_ = false, probing_ = false, rejected_ = false;
  std::vector<double> confidence_, acceptance_;
  int64_t pos_ = 0, block_ = 1, next_pos_ = 0;
  double saving_, per_call_ = 0, time_weight_, started_ = 0;
  std::optional<Pending> pending_;
  std::map<int64_t, Costs> costs_;
};

}  // namespace dflash
