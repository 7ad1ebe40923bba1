// Lookup proposals (lookup.h): a scan back from the context's end, a few thousand comparisons a round, and the
// planner of which of them to verify.
#include "lookup.h"

#include <algorithm>
#include <utility>

namespace dflash {

Lookup lookup(const int64_t* context, int64_t length, int64_t max_tokens) {
  for (int64_t n = std::min(kMaxNgram, length - 1); n >= kMinNgram && max_tokens > 0; --n) {
    const int64_t* suffix = context + length - n;
    for (int64_t start = length - n - 1; start >= 0; --start) {  // latest first; never the suffix itself
      if (std::equal(suffix, suffix + n, context + start)) {
        const int64_t follow = start + n;  // < length: the occurrence ends before the suffix does
        return {{context + follow, context + std::min(length, follow + max_tokens)}, n};
      }
    }
  }
  return {};
}

LookupPlanner::LookupPlanner(CostCurve curve, int64_t max_block)
    : curve_(std::move(curve)),
      max_block_(std::min(max_block, curve_.max_block())),
      rates_(kMaxNgram - kMinNgram + 1) {}

int64_t LookupPlanner::verify_count(int64_t ngram, int64_t proposed, int64_t pos) {
  Rates& r = *(last_ = &rates_[std::clamp(ngram, kMinNgram, kMaxNgram) - kMinNgram]);
  proposed = std::min(proposed, max_block_ - 1);
  if (proposed < 1) {
    rate_ = 0;
    return 0;
  }
  std::vector<double> acceptance(proposed, r.next_accepted / r.next_tried);
  acceptance[0] = r.first_accepted / r.first_tried;
  const std::vector<double> expected = expected_tokens(acceptance);
  int64_t k = 0;
  double best = expected[0] / curve_.target(1, pos);
  for (int64_t j = 1; j <= proposed; ++j) {
    const double rate = expected[j] / curve_.target(j + 1, pos);
    if (rate > best) best = rate, k = j;
  }
  if (k > 0) {
    r.declined = 0;
  } else if (++r.declined > kProbeGap) {
    r.declined = 0, k = 1;
  }
  rate_ = expected[k] / curve_.target(k + 1, pos);
  return k;
}

void LookupPlanner::observe(int64_t verified, int64_t accepted) {
  if (verified < 1 || !last_) return;
  Rates& r = *last_;
  for (double* count : {&r.first_accepted, &r.first_tried, &r.next_accepted, &r.next_tried}) *count *= kMemory;
  r.first_tried += 1, r.first_accepted += accepted > 0;
  for (int64_t i = 1; i < std::min(accepted + 1, verified); ++i) r.next_tried += 1, r.next_accepted += i < accepted;
}

int64_t lookup_round(AdaptivePlanner& planner, LookupPlanner& lookup, int64_t ngram, int64_t proposed, int64_t pos) {
  const int64_t k = lookup.verify_count(ngram, proposed, pos);
  return k > 0 && lookup.rate() > planner.expected_rate() ? k : 0;
}

}  // namespace dflash
