// Lookup proposals: drafts that need no model. A reply after a document, a rewrite, a code edit or a later turn
// repeats long runs of its context, so the tokens that followed the latest earlier occurrence of the context's last
// n tokens are a proposal (prompt lookup decoding; llama.cpp's ngram-simple). n is tried from kMaxNgram down to
// kMinNgram: the longest recurring suffix is the likeliest to go on alike. A proposal is one token per position, a
// point mass, so the verify rule treats it as an argmax proposal (q one-hot): greedy and sampled output stay exact.
#pragma once

#include <cstdint>
#include <vector>

namespace dflash {

constexpr int64_t kMinNgram = 2;  // a lone recurring token proposes mostly noise
constexpr int64_t kMaxNgram = 8;

// Up to `max_tokens` tokens that followed the latest earlier occurrence of the longest recurring suffix of
// `context` (n from kMaxNgram down to kMinNgram); none where no such suffix recurs.
std::vector<int64_t> lookup(const int64_t* context, int64_t length, int64_t max_tokens);

}  // namespace dflash
