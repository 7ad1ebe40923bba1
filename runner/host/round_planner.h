// What the decode loop asks before and after each round (generate.py's Planner protocol, the same three hooks):
// block() before a round, verify_count() once the draft proposed, observe() once the target verified.
#pragma once

#include <cstdint>

namespace dflash {

class RoundPlanner {
 public:
  virtual ~RoundPlanner() = default;
  virtual int64_t block(int64_t pos, int64_t room) = 0;  // the draft block (1: a plain step), at most room
  virtual int64_t verify_count(const float* logits, int64_t rows, int64_t vocab, int64_t pos) = 0;
  virtual void observe(int64_t verified, int64_t accepted) = 0;
};

}  // namespace dflash
