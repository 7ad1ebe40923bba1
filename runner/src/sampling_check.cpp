// A C entry point to the sampler's walk through a DFlash2 lattice, so that a test can hold it to
// sampling.walk on the same lattice from Python (ctypes: runner.bindings.CppWalk).
#include <algorithm>

#include "sampling.h"

extern "C" {

// The path through `lattice` ([positions, k] candidates and unary, [positions, k, k] pair) as a sampler with this
// temperature, proposal mode and seed walks it: writes `path` [positions], `scores` [positions, k] and, for sampled
// proposals (temperature > 0 and `sample`), `q` [positions, vocab] (left as it is otherwise).
void dflash_walk(const int64_t* candidates, const float* unary, const float* pair, int64_t positions, int64_t k,
                 int64_t vocab, double temperature, int sample, uint64_t seed, int64_t* path, float* scores, float* q) {
  dflash::Sampler sampler({temperature, 1.0, 0, sample != 0, seed});
  std::vector<float> q_rows, score_rows;
  const std::vector<int64_t> walked =
      sampler.walk({candidates, unary, pair, positions, k}, vocab, q_rows, score_rows);
  std::copy(walked.begin(), walked.end(), path);
  std::copy(score_rows.begin(), score_rows.end(), scores);
  std::copy(q_rows.begin(), q_rows.end(), q);
}

}  // extern "C"
