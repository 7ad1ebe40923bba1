// Lookup proposals (lookup.h): a scan back from the context's end, a few thousand comparisons a round.
#include "lookup.h"

#include <algorithm>

namespace dflash {

std::vector<int64_t> lookup(const int64_t* context, int64_t length, int64_t max_tokens) {
  for (int64_t n = std::min(kMaxNgram, length - 1); n >= kMinNgram && max_tokens > 0; --n) {
    const int64_t* suffix = context + length - n;
    for (int64_t start = length - n - 1; start >= 0; --start) {  // latest first; never the suffix itself
      if (std::equal(suffix, suffix + n, context + start)) {
        const int64_t follow = start + n;  // < length: the occurrence ends before the suffix does
        return {context + follow, context + std::min(length, follow + max_tokens)};
      }
    }
  }
  return {};
}

}  // namespace dflash
