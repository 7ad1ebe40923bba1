#include "sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace dflash {
namespace {

// Scores to probabilities, in place (torch.softmax, in floats).
void softmax(std::vector<float>& scores) {
  const float best = *std::max_element(scores.begin(), scores.end());
  float total = 0;
  for (auto& s : scores) total += (s = std::exp(s - best));
  for (auto& s : scores) s /= total;
}

}  // namespace

std::vector<int64_t> argmax(const float* logits, int64_t rows, int64_t vocab) {
  std::vector<int64_t> out(rows);
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = logits + r * vocab;
    out[r] = std::max_element(row, row + vocab) - row;
  }
  return out;
}

Sampler::Sampler(const Sampling& sampling) : sampling_(sampling), generator_(sampling.seed) {}

double Sampler::uniform() {
  return static_cast<double>(generator_() >> 11) * 0x1.0p-53;  // [0, 1), the same on every standard library
}

void Sampler::distribution(const float* logits, int64_t vocab, std::vector<float>& probs) const {
  probs.resize(vocab);
  const auto temperature = static_cast<float>(sampling_.temperature);
  for (int64_t i = 0; i < vocab; ++i) probs[i] = logits[i] / temperature;
  if (sampling_.top_k > 0 && sampling_.top_k < vocab) {  // keep the k largest, and any tied with the k-th
    std::vector<float> sorted(probs);
    std::nth_element(sorted.begin(), sorted.begin() + (sampling_.top_k - 1), sorted.end(), std::greater<float>());
    const float kth = sorted[sampling_.top_k - 1];
    for (auto& s : probs) s = s < kth ? -std::numeric_limits<float>::infinity() : s;
  }
  softmax(probs);
  if (sampling_.top_p < 1) {
    // A token stays while the more likely tokens before it hold less than top_p. Only the most likely `head`
    // tokens are sorted, `head` growing until they hold top_p, as sampling.py's nucleus does: sorting a real
    // vocabulary (150k tokens) at every verified position would cost more than the verify call.
    std::vector<int64_t> order(vocab);
    std::iota(order.begin(), order.end(), 0);
    const auto likelier = [&](int64_t a, int64_t b) { return probs[a] > probs[b]; };
    int64_t head = std::min<int64_t>(64, vocab);
    for (;; head = std::min(vocab, 4 * head)) {
      std::partial_sort(order.begin(), order.begin() + head, order.end(), likelier);
      float held = 0;
      for (int64_t i = 0; i < head; ++i) held += probs[order[i]];
      if (head == vocab || held >= sampling_.top_p) break;
    }
    std::vector<float> kept(vocab, 0.f);
    float before = 0;  // past the head, it holds top_p
    for (int64_t i = 0; i < head && before < sampling_.top_p; ++i) {
      kept[order[i]] = probs[order[i]];
      before += probs[order[i]];
    }
    for (auto& p : kept) p /= before;
    probs.swap(kept);
  }
}

int64_t Sampler::draw(const std::vector<float>& probs) {
  const double total = std::accumulate(probs.begin(), probs.end(), 0.0);
  const double target = uniform() * total;
  double sum = 0;
  int64_t last = 0;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] <= 0) continue;
    sum += probs[i];
    last = i;
    if (sum > target) return i;
  }
  return last;  // rounding left the target past the last token's sum
}

int64_t Sampler::next_token(const float* logits, int64_t vocab) {
  if (sampling_.temperature == 0) return argmax(logits, 1, vocab)[0];
  distribution(logits, vocab, p_);
  return draw(p_);
}

std::vector<int64_t> Sampler::propose(const float* logits, int64_t rows, int64_t vocab, std::vector<float>& q) {
  q.clear();
  if (sampling_.temperature == 0 || !sampling_.sample_proposals) return argmax(logits, rows, vocab);
  std::vector<int64_t> out(rows);
  q.resize(rows * vocab);
  for (int64_t r = 0; r < rows; ++r) {
    distribution(logits + r * vocab, vocab, p_);
    std::copy(p_.begin(), p_.end(), q.begin() + r * vocab);
    out[r] = draw(p_);
  }
  return out;
}

void to_vocab(const std::vector<int64_t>& ids, int64_t vocab, std::vector<int64_t>& proposals, std::vector<float>& q) {
  for (int64_t& p : proposals) p = ids[p];
  if (q.empty()) return;
  const auto n = static_cast<int64_t>(ids.size());
  std::vector<float> full(proposals.size() * vocab, 0.f);
  for (size_t r = 0; r < proposals.size(); ++r) {
    for (int64_t i = 0; i < n; ++i) full[r * vocab + ids[i]] = q[r * n + i];
  }
  q = std::move(full);
}

std::vector<int64_t> Sampler::walk(const Lattice& lattice, int64_t vocab, std::vector<float>& q,
                                   std::vector<float>& scores) {
  const int64_t k = lattice.k;
  const bool sampled = sampling_.temperature > 0 && sampling_.sample_proposals;
  const auto temperature = static_cast<float>(sampling_.temperature);
  std::vector<int64_t> path(lattice.positions);
  scores.resize(lattice.positions * k);
  q.assign(sampled ? lattice.positions * vocab : 0, 0.f);
  int64_t chosen = 0;  // the index of the candidate chosen at the position before (none before the first: 0)
  for (int64_t p = 0; p < lattice.positions; ++p) {
    float* row = scores.data() + p * k;
    const float* after = lattice.pair + (p * k + chosen) * k;
    for (int64_t i = 0; i < k; ++i) row[i] = lattice.unary[p * k + i] + after[i];
    if (sampled) {
      p_.resize(k);
      for (int64_t i = 0; i < k; ++i) p_[i] = row[i] / temperature;
      softmax(p_);
      chosen = draw(p_);
      for (int64_t i = 0; i < k; ++i) q[p * vocab + lattice.candidates[p * k + i]] = p_[i];
    } else {
      chosen = argmax(row, 1, k)[0];
    }
    path[p] = lattice.candidates[p * k + chosen];
  }
  return path;
}

std::pair<int64_t, int64_t> Sampler::verify(const std::vector<int64_t>& proposals, const std::vector<float>& q,
                                            const float* logits, int64_t vocab) {
  const auto n = static_cast<int64_t>(proposals.size());
  if (sampling_.temperature == 0) {
    const std::vector<int64_t> verified = argmax(logits, n + 1, vocab);
    int64_t accepted = 0;
    while (accepted < n && proposals[accepted] == verified[accepted]) ++accepted;
    return {accepted, verified[accepted]};
  }
  for (int64_t i = 0; i < n; ++i) {  // p row by row: rows after a rejection are never needed
    distribution(logits + i * vocab, vocab, p_);
    const int64_t x = proposals[i];
    const float* qi = q.empty() ? nullptr : q.data() + i * vocab;
    const double accept = qi ? std::min(1.0, static_cast<double>(p_[x]) / qi[x]) : p_[x];
    if (uniform() >= accept) {  // rejected: the next token from normalize(max(0, p - q)), q one-hot at x if argmax
      rest_ = p_;
      if (qi) {
        for (int64_t t = 0; t < vocab; ++t) rest_[t] = std::max(0.f, p_[t] - qi[t]);
      } else {
        rest_[x] = 0;
      }
      const bool mass = std::any_of(rest_.begin(), rest_.end(), [](float v) { return v > 0; });
      return {i, draw(mass ? rest_ : p_)};
    }
  }
  distribution(logits + n * vocab, vocab, p_);
  return {n, draw(p_)};
}

}  // namespace dflash
