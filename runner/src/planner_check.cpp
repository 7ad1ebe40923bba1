// A C entry point to AdaptivePlanner, so that a test can give it and adaptive.py's planner the same rounds
// from Python (ctypes: cpp_runner.CppPlanner) and compare every choice.
#include <cstring>

#include "errors.h"
#include "planner.h"

extern "C" {

// A planner over the cost curve in `curve_path` (checked to be of `programs`), or null with the reason in `error`.
void* dflash_planner_new(const char* curve_path, const char* programs, int64_t max_block, char* error,
                         size_t error_size) {
  try {
    return new dflash::AdaptivePlanner(dflash::CostCurve::load(curve_path, programs), max_block);
  } catch (const dflash::UserError& e) {
    std::strncpy(error, e.what(), error_size - 1);
    error[error_size - 1] = '\0';
    return nullptr;
  }
}

int64_t dflash_planner_block(void* planner, int64_t pos, int64_t room) {
  return static_cast<dflash::AdaptivePlanner*>(planner)->block(pos, room);
}

int64_t dflash_planner_verify_count(void* planner, const float* logits, int64_t rows, int64_t vocab, int64_t pos) {
  return static_cast<dflash::AdaptivePlanner*>(planner)->verify_count(logits, rows, vocab, pos);
}

void dflash_planner_observe(void* planner, int64_t verified, int64_t accepted, double seconds) {
  static_cast<dflash::AdaptivePlanner*>(planner)->observe(verified, accepted, seconds);
}

// Writes saving() and per_call(): the test holds them to adaptive.py's own, digit for digit.
void dflash_planner_learned(const void* planner, double* out) {
  const auto* p = static_cast<const dflash::AdaptivePlanner*>(planner);
  out[0] = p->saving(), out[1] = p->per_call();
}

void dflash_planner_free(void* planner) { delete static_cast<dflash::AdaptivePlanner*>(planner); }

}  // extern "C"
