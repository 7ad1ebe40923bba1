// The host library's C API (libdflash_host.so): the cost curve and its measurement, auto's planners (a draft's and
// lookup's), the DFlash2 lattice walk and lookup proposals of this directory, for the Python engine (ctypes:
// dflash_et/runtime/native.py), so that both runners run one implementation of each rule. Handles are opaque; each
// kind has its _free. A call that can fail writes its one-line reason to (error, error_size) and returns null.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>

#include "errors.h"
#include "lookup.h"
#include "planner.h"
#include "sampling.h"

namespace {

using dflash::CostCurve;
using dflash::RoundPlanner;

size_t copy_out(const std::string& text, char* out, size_t size) {  // the size it needs, written if it fits
  if (text.size() < size) std::memcpy(out, text.c_str(), text.size() + 1);
  return text.size() + 1;
}

template <typename Make>
void* or_error(Make make, char* error, size_t error_size) {
  try {
    return make();
  } catch (const dflash::UserError& e) {
    std::strncpy(error, e.what(), error_size - 1);
    error[error_size - 1] = '\0';
    return nullptr;
  }
}

}  // namespace

extern "C" {

// The cost curve in the file `path`, checked to be of `programs`.
void* dflash_curve_load(const char* path, const char* programs, char* error, size_t error_size) {
  return or_error([&] { return new CostCurve(CostCurve::load(path, programs)); }, error, error_size);
}

// The cost curve in JSON `text`, read from `source` (named in the error).
void* dflash_curve_parse(const char* text, const char* source, char* error, size_t error_size) {
  return or_error([&] { return new CostCurve(CostCurve::parse(text, source)); }, error, error_size);
}

size_t dflash_curve_json(const void* curve, char* out, size_t size) {
  return copy_out(static_cast<const CostCurve*>(curve)->to_json(), out, size);
}

double dflash_curve_target(const void* curve, int64_t tokens, int64_t pos) {
  return static_cast<const CostCurve*>(curve)->target(tokens, pos);
}

double dflash_curve_draft(const void* curve, int64_t block, int64_t pos) {
  return static_cast<const CostCurve*>(curve)->draft(block, pos);
}

void dflash_curve_free(void* curve) { delete static_cast<CostCurve*>(curve); }

size_t dflash_programs_identity(const int64_t* parts, int64_t n, char* out, size_t size) {
  return copy_out(dflash::programs_identity({parts, parts + n}), out, size);
}

int dflash_planned(int is_auto, int greedy) { return dflash::planned(is_auto, greedy); }

// auto's planner over a copy of `curve`, for drafts of at most `max_block` tokens; `time_weight` how fast it follows
// the rounds' wall times (0: the curve alone; negative: the planner's default).
void* dflash_planner_new(const void* curve, int64_t max_block, double time_weight) {
  const auto& c = *static_cast<const CostCurve*>(curve);
  auto* planner = new dflash::AdaptivePlanner(c, max_block, time_weight < 0 ? dflash::AdaptivePlanner::kTimeWeight
                                                                             : time_weight);
  return static_cast<RoundPlanner*>(planner);
}

int64_t dflash_planner_block(void* planner, int64_t pos, int64_t room) {
  return static_cast<RoundPlanner*>(planner)->block(pos, room);
}

int64_t dflash_planner_verify_count(void* planner, const float* logits, int64_t rows, int64_t vocab, int64_t pos) {
  return static_cast<RoundPlanner*>(planner)->verify_count(logits, rows, vocab, pos);
}

// What the target made of the round; `seconds` its wall time (negative: the time since block()).
void dflash_planner_observe(void* planner, int64_t verified, int64_t accepted, double seconds) {
  auto* adaptive = dynamic_cast<dflash::AdaptivePlanner*>(static_cast<RoundPlanner*>(planner));
  if (adaptive && seconds >= 0) return adaptive->observe(verified, accepted, seconds);
  static_cast<RoundPlanner*>(planner)->observe(verified, accepted);
}

// auto's planner's saving() and per_call() (ms) into out[0..1].
void dflash_planner_learned(const void* planner, double* out) {
  const auto* p = dynamic_cast<const dflash::AdaptivePlanner*>(static_cast<const RoundPlanner*>(planner));
  out[0] = p->saving(), out[1] = p->per_call();
}

void dflash_planner_free(void* planner) { delete static_cast<RoundPlanner*>(planner); }

// The measurement of a cost curve (dflash::CostSweep says how the caller runs it).
void* dflash_sweep_new(int64_t max_block, int64_t max_seq_len, int64_t repeats) {
  return new dflash::CostSweep(max_block, max_seq_len, repeats);
}

// Writes at most `size` start positions to `out`; how many there are.
int64_t dflash_sweep_starts(const void* sweep, int64_t* out, int64_t size) {
  const auto& starts = static_cast<const dflash::CostSweep*>(sweep)->starts;
  std::copy_n(starts.begin(), std::min<size_t>(starts.size(), size), out);
  return starts.size();
}

int64_t dflash_sweep_tokens(const void* sweep) { return static_cast<const dflash::CostSweep*>(sweep)->tokens; }

int64_t dflash_sweep_count(const void* sweep) { return static_cast<const dflash::CostSweep*>(sweep)->sweeps(); }

// Sweep number `n`'s planner (freed with dflash_planner_free).
void* dflash_sweep_planner(const void* sweep, int64_t n) {
  return static_cast<RoundPlanner*>(new dflash::Sweep(static_cast<const dflash::CostSweep*>(sweep)->planner(n)));
}

void dflash_sweep_record(void* sweep, int64_t start, int64_t n, const void* planner, int64_t rounds,
                         const double* verify_s, const double* draft_s) {
  const auto& plan = dynamic_cast<const dflash::Sweep&>(*static_cast<const RoundPlanner*>(planner));
  static_cast<dflash::CostSweep*>(sweep)->record(start, n, plan, {verify_s, verify_s + rounds},
                                                 {draft_s, draft_s + rounds});
}

void* dflash_sweep_curve(const void* sweep, const char* programs) {
  return new CostCurve(static_cast<const dflash::CostSweep*>(sweep)->curve(programs));
}

void dflash_sweep_free(void* sweep) { delete static_cast<dflash::CostSweep*>(sweep); }

// Lookup proposals after `context` [length] (lookup.h): writes at most `max_tokens` to `out` and the length of the
// recurring suffix they follow to `ngram`; how many it wrote.
int64_t dflash_lookup(const int64_t* context, int64_t length, int64_t max_tokens, int64_t* out, int64_t* ngram) {
  const dflash::Lookup found = dflash::lookup(context, length, max_tokens);
  std::copy(found.tokens.begin(), found.tokens.end(), out);
  *ngram = found.ngram;
  return found.tokens.size();
}

// auto's planner of lookup proposals (lookup.h) over a copy of `curve`, for blocks of at most `max_block` tokens.
void* dflash_lookup_planner_new(const void* curve, int64_t max_block) {
  return new dflash::LookupPlanner(*static_cast<const CostCurve*>(curve), max_block);
}

int64_t dflash_lookup_planner_verify_count(void* planner, int64_t ngram, int64_t proposed, int64_t pos) {
  return static_cast<dflash::LookupPlanner*>(planner)->verify_count(ngram, proposed, pos);
}

void dflash_lookup_planner_observe(void* planner, int64_t verified, int64_t accepted) {
  static_cast<dflash::LookupPlanner*>(planner)->observe(verified, accepted);
}

void dflash_lookup_planner_free(void* planner) { delete static_cast<dflash::LookupPlanner*>(planner); }

// auto with a draft and lookup proposals (lookup.h): how many lookup proposals take the round auto's `planner`
// planned (0: the planner's round goes ahead).
int64_t dflash_lookup_round(void* planner, void* lookup_planner, int64_t ngram, int64_t proposed, int64_t pos) {
  return dflash::lookup_round(dynamic_cast<dflash::AdaptivePlanner&>(*static_cast<RoundPlanner*>(planner)),
                              *static_cast<dflash::LookupPlanner*>(lookup_planner), ngram, proposed, pos);
}

// The round auto's `planner` planned went to lookup proposals, of which the target accepted `accepted`.
void dflash_planner_taken(void* planner, int64_t accepted) {
  dynamic_cast<dflash::AdaptivePlanner&>(*static_cast<RoundPlanner*>(planner)).taken(accepted);
}

// The path through `lattice` ([positions, k] candidates and unary, [positions, k, k] pair) as a sampler with this
// temperature, proposal mode and seed walks it: writes `path` [positions], `scores` [positions, k] and, for sampled
// proposals (temperature > 0 and `sample`), `q` [positions, vocab] (left as it is otherwise).
void dflash_walk(const int64_t* candidates, const float* unary, const float* pair, int64_t positions, int64_t k,
                 int64_t vocab, double temperature, int sample, uint64_t seed, int64_t* path, float* scores, float* q) {
  dflash::Sampler sampler({temperature, 1.0, 0, sample != 0, seed});
  std::vector<float> q_rows, score_rows;
  const std::vector<int64_t> walked = sampler.walk({candidates, unary, pair, positions, k}, vocab, q_rows, score_rows);
  std::copy(walked.begin(), walked.end(), path);
  std::copy(score_rows.begin(), score_rows.end(), scores);
  std::copy(q_rows.begin(), q_rows.end(), q);
}

}  // extern "C"
