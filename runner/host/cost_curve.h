// The cost curve `block_size: auto` decides by: milliseconds per program call on one device, by call size and
// cache position, and how it is measured (`CostSweep`: decoding rounds of every block, timed as decoding runs
// them). Both runners measure, read, check and write curves through this file alone: the C++ runner directly,
// the Python engine through the host library's C API (host_api.cpp, dflash_et/runtime/native.py).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "round_planner.h"

namespace dflash {

// Seconds on a steady clock (every timing of the runners' host loops).
double now();

// Milliseconds per program call at a few cache positions, interpolated between them (np.interp's rule); the
// file the bench stage writes (reports/cost_curve.json).
struct CostCurve {
  std::vector<int64_t> positions;
  std::vector<std::vector<double>> target_ms;  // [position][T - 1]: a target call of T = 1..max_block tokens
  std::vector<std::vector<double>> draft_ms;   // [position][B - 2]: a draft call with a block of B = 2..max_block
  std::string programs;                        // which programs were timed (`programs_identity`)
  double confidence_ms = 0;                    // reading the draft's confidence in a block of max_block

  int64_t max_block() const { return target_ms[0].size(); }
  double target(int64_t tokens, int64_t pos) const;
  double draft(int64_t block, int64_t pos) const;
  std::string to_json() const;
  // The curve in JSON `text`; UserError (one line) naming `source` and the fix otherwise.
  static CostCurve parse(const std::string& text, const std::string& source);
  // The curve in `path`, checked to be of `programs`; UserError (one line) otherwise.
  static CostCurve load(const std::string& path, const std::string& programs);
};

// Which programs a cost curve was measured on: their checkpoint ids, limits and file sizes (`parts`), joined.
std::string programs_identity(const std::vector<int64_t>& parts);

// The draft's probability of its top token in each row of its logits [rows, vocab].
std::vector<double> confidence(const float* logits, int64_t rows, int64_t vocab);

// A planner that runs `per_block` rounds of each block B = max_block..1 (or 1..max_block), verifying every
// proposal, then plain steps; it times reading the draft's confidence in the largest block.
class Sweep : public RoundPlanner {
 public:
  Sweep(int64_t max_block, int64_t per_block, bool descending);
  int64_t block(int64_t pos, int64_t room) override;
  int64_t verify_count(const float* logits, int64_t rows, int64_t vocab, int64_t pos) override;
  void observe(int64_t verified, int64_t accepted) override {}

  std::vector<int64_t> blocks;  // round by round
  std::vector<double> confidence_ms;

 private:
  int64_t max_block_, rounds_ = 0;
};

// How a cost curve is measured: decoding rounds with a block of B = 1..max_block (B = 1: a plain step), run by
// the runner's own decode loop with a greedy verification that accepts nothing, at the start, middle and end
// of the cache. Rounds as decoding runs them, host work between the calls included, cost what isolated calls
// do not (docs/measurements.md#adaptive-planner). Each sweep runs `per_block` (3) rounds of every block back to
// back (the same shapes repeat in decoding) and keeps the last two; the first sweep warms up and is dropped.
// Per length, the typical time is the mean of the middle half of its rounds (steadier than the median or the
// fastest), then no length dearer than a longer one.
//   for each start in starts: for sweep in 0..sweeps()-1: decode `tokens` new tokens after a prompt of `start`
//   tokens with planner(sweep), then record(start index, sweep, that planner, its rounds' times); curve().
class CostSweep {
 public:
  CostSweep(int64_t max_block, int64_t max_seq_len, int64_t repeats);
  std::vector<int64_t> starts;  // prompt lengths the sweeps start at
  int64_t tokens;               // new tokens each sweep's generation asks for
  int64_t sweeps() const { return repeats_ + 1; }
  Sweep planner(int64_t sweep) const;
  void record(size_t start, int64_t sweep, const Sweep& plan, const std::vector<double>& verify_s,
              const std::vector<double>& draft_s);
  CostCurve curve(const std::string& programs) const;

 private:
  int64_t max_block_, repeats_, per_block_, span_;
  bool both_;  // sweeps alternate ascending and descending (each block then timed at the same mean position)
  std::vector<std::vector<std::vector<double>>> target_times_, draft_times_;  // [start][T - 1 or B - 2][time]
  std::vector<double> confidence_ms_;
};

}  // namespace dflash
