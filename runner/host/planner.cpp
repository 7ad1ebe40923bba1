#include "planner.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>

namespace dflash {

bool planned(bool is_auto, bool greedy) { return is_auto && greedy; }

std::vector<double> expected_tokens(const std::vector<double>& acceptance) {
  std::vector<double> out{1.0};
  double reach = 1.0;
  for (double a : acceptance) {
    reach *= a;
    out.push_back(out.back() + reach);
  }
  return out;
}

Calibration::Calibration(int bins, double prior_weight, double memory)
    : accepted_(bins, 0.0), tried_(bins, 0.0), memory_(memory) {
  for (int b = 0; b < bins; ++b) {
    prior_.emplace_back((b + 0.5) / bins * prior_weight, prior_weight);
    rate_.push_back(prior_.back().first / prior_.back().second);
  }
}

size_t Calibration::bin(double confidence) const {
  return std::min(static_cast<size_t>(confidence * rate_.size()), rate_.size() - 1);
}

std::vector<double> Calibration::operator()(const std::vector<double>& confidence) const {
  std::vector<double> out;
  for (double c : confidence) out.push_back(rate_[bin(c)]);
  return out;
}

void Calibration::observe(const std::vector<double>& confidence, int64_t accepted) {
  for (size_t b = 0; b < rate_.size(); ++b) accepted_[b] *= memory_, tried_[b] *= memory_;
  for (int64_t i = 0; i < std::min<int64_t>(accepted + 1, confidence.size()); ++i) {
    const size_t b = bin(confidence[i]);
    tried_[b] += 1;
    accepted_[b] += i < accepted;
  }
  for (size_t b = 0; b < rate_.size(); ++b) {
    rate_[b] = (prior_[b].first + accepted_[b]) / (prior_[b].second + tried_[b]);
  }
}

Window::Window(const std::vector<double>& row, size_t size, size_t react)
    : total(row), lately(row), size(size), react(react), rows_{row} {}

std::vector<double> Window::mean() const {
  std::vector<double> out;
  for (double t : total) out.push_back(t / static_cast<double>(rows_.size()));
  return out;
}

void Window::add(const std::vector<double>& row) {
  if (borrowed) {
    total = lately = row, rows_ = {row}, borrowed = false;
    return;
  }
  if (rows_.size() >= react) {
    const std::vector<double>& leaving = rows_[rows_.size() - react];
    for (size_t t = 0; t < row.size(); ++t) lately[t] = lately[t] - leaving[t] + row[t];
  } else {
    for (size_t t = 0; t < row.size(); ++t) lately[t] = lately[t] + row[t];
  }
  if (rows_.size() == size) {
    for (size_t t = 0; t < row.size(); ++t) total[t] = total[t] - rows_.front()[t] + row[t];
    rows_.pop_front();
  } else {
    for (size_t t = 0; t < row.size(); ++t) total[t] = total[t] + row[t];
  }
  rows_.push_back(row);
}

int64_t band_of(int64_t pos) {
  int64_t band = 0;
  for (int64_t q = pos / kBand; q > 0; q >>= 1) ++band;  // Python's int.bit_length()
  return band;
}

Band::Band(Calibration calibration, std::vector<double> position_rate, const std::vector<double>& later,
           const std::vector<double>& openings, size_t window, size_t react, int64_t chosen)
    : calibration(std::move(calibration)),
      position_rate(std::move(position_rate)),
      later(later, window, react),
      openings(openings, window, react),
      chosen(chosen) {}

Band Band::seeded() const {
  Band band(calibration, position_rate, later.mean(), openings.mean(), later.size, later.react, chosen);
  band.later.borrowed = band.openings.borrowed = true;
  band.probe_gap = probe_gap, band.plain_left = plain_left, band.falling_back = falling_back;
  return band;
}

AdaptivePlanner::AdaptivePlanner(CostCurve curve, int64_t max_block, double time_weight)
    : curve_(std::move(curve)),
      max_block_(std::min(max_block, curve_.max_block())),
      first_(Calibration(), std::vector<double>(max_block_ - 1, 0.9),
             expected_tokens(std::vector<double>(max_block_ - 1, 0.9)),
             expected_tokens(std::vector<double>(max_block_ - 1, 0.9)), kWindow, kReact, max_block_),
      band_(&first_),
      saving_(std::numeric_limits<double>::infinity()),
      time_weight_(time_weight) {}

const AdaptivePlanner::Costs& AdaptivePlanner::cost(int64_t pos) {
  const int64_t bucket = pos / 16;
  auto found = costs_.find(bucket);
  if (found == costs_.end()) {
    const int64_t at = bucket * 16 + 8;
    Costs c{{}, {0.0}};
    for (int64_t t = 1; t <= max_block_; ++t) c.first.push_back(curve_.target(t, at));
    for (int64_t b = 2; b <= max_block_; ++b) c.second.push_back(curve_.draft(b, at));
    found = costs_.emplace(bucket, std::move(c)).first;
  }
  return found->second;
}

double AdaptivePlanner::round_ms(int64_t pos, int64_t block, int64_t verified) {
  const auto& [target, draft] = cost(pos);
  return draft[block - 1] + target[verified] + per_call_ * (1 + (block > 1));
}

int64_t AdaptivePlanner::best_block(const std::vector<double>& total, const std::vector<double>& cost, int64_t count) {
  int64_t best = 0;
  for (int64_t b = 1; b < count; ++b) {
    if (total[b + 1] / cost[b + 1] > total[best + 1] / cost[best + 1]) best = b;
  }
  return 2 + best;
}

int64_t AdaptivePlanner::block(int64_t pos, int64_t room) {
  const bool opening = pos != next_pos_;
  if (pending_) commit(opening);
  if (opening) band_ = &band_at(pos);
  probing_ = false, pos_ = pos, block_ = 1, started_ = now();
  int64_t block = later_block(pos, room);
  opening_ = opening && block > 1 && !probing_;
  if (opening_) {
    std::vector<double> cost;
    for (int64_t b = 1; b <= std::min(room, max_block_); ++b) cost.push_back(round_ms(pos, b, b - 1));
    block = best_block(band_->openings.total, cost, cost.size() - 1);
  }
  return planned_ = block;
}

double AdaptivePlanner::expected_rate() {
  if (planned_ < 2) return 1.0 / round_ms(pos_, 1, 0);
  const std::vector<double> mean = (opening_ ? band_->openings : band_->later).mean();
  return mean[planned_ - 1] / round_ms(pos_, planned_, planned_ - 1);
}

Band& AdaptivePlanner::band_at(int64_t pos) {
  const int64_t key = band_of(pos);
  auto found = bands_.find(key);
  if (found != bands_.end()) return found->second;
  if (bands_.empty()) return bands_.emplace(key, first_).first->second;
  int64_t nearest = bands_.begin()->first;  // the nearest seen, the shallower on ties (min by (|k - key|, k))
  for (const auto& [k, band] : bands_) {
    if (std::abs(k - key) < std::abs(nearest - key)) nearest = k;
  }
  return bands_.emplace(key, bands_.at(nearest).seeded()).first->second;
}

int64_t AdaptivePlanner::later_block(int64_t pos, int64_t room) {
  Band& band = *band_;
  if (band.plain_left > 0) {
    --band.plain_left;
    return 1;
  }
  room = std::min(room, max_block_);
  if (room < 2) return 1;
  if (rounds_ % 4 && !rejected_ && !band.falling_back && band.chosen <= room) return band.chosen;
  std::vector<double> cost;
  for (int64_t b = 1; b <= room; ++b) cost.push_back(round_ms(pos, b, b - 1));
  const std::vector<double>& total = band.later.total;
  band.chosen = best_block(total, cost, room - 1);
  const auto drafting_pays = [&](const std::vector<double>& sums) {
    for (int64_t b = 1; b < room; ++b) {
      if (sums[b] / cost[b] > sums[0] / cost[0]) return true;
    }
    return false;
  };
  if (drafting_pays(band.later.lately) || (!band.falling_back && drafting_pays(total))) {
    band.probe_gap = 2, band.falling_back = false;
  } else {
    probing_ = true, band.plain_left = band.probe_gap, band.falling_back = true;
    band.probe_gap = std::min(2 * band.probe_gap, kMaxProbeGap);
  }
  return band.chosen;
}

int64_t AdaptivePlanner::verify_count(const float* logits, int64_t rows, int64_t vocab, int64_t pos) {
  const int64_t n = rows;
  pos_ = pos, block_ = n + 1;
  if (saving_ <= curve_.confidence_ms && rounds_ % 8 && !probing_) {
    confidence_.clear();
    acceptance_ = band_->position_rate;
    return n;
  }
  confidence_ = confidence(logits, rows, vocab);
  acceptance_ = band_->calibration(confidence_);
  acceptance_.insert(acceptance_.end(), band_->position_rate.begin() + n, band_->position_rate.end());
  const std::vector<double> expected = expected_tokens(acceptance_);
  std::vector<double> cost;
  for (int64_t k = 0; k <= n; ++k) cost.push_back(round_ms(pos, n + 1, k));
  int64_t k = 0;
  for (int64_t j = 1; j <= n; ++j) {
    if (expected[j] / cost[j] > expected[k] / cost[k]) k = j;
  }
  const double saved = expected[k] * cost[n] / expected[n] - cost[k];
  saving_ = std::isinf(saving_) ? saved : saving_ + 0.1 * (saved - saving_);
  return k;
}

void AdaptivePlanner::commit(bool ended) {
  Pending& p = *pending_;
  if (ended) std::fill(p.row.begin() + p.accepted, p.row.end(), 0.0);
  const std::vector<double> row = expected_tokens(p.row);
  (p.opening ? band_->openings : band_->later).add(row);
  for (Window* window : {&band_->openings, &band_->later}) {  // the band's first round: all it knows of it
    if (window->borrowed) window->add(row);
  }
  ++rounds_;
  pending_.reset();
}

void AdaptivePlanner::observe(int64_t verified, int64_t accepted) { observe(verified, accepted, now() - started_); }

void AdaptivePlanner::observe(int64_t verified, int64_t accepted, double seconds) {
  const auto& [target, draft] = cost(pos_);
  const int64_t b = block_;
  const double over = (1000 * seconds - draft[b - 1] - target[verified]) / (1 + (b > 1));
  per_call_ = std::max(0.0, per_call_ + time_weight_ * (over - per_call_));
  next_pos_ = pos_ + accepted + 1;
  rejected_ = verified > 0 && accepted == 0;
  if (b == 1) return;
  Band& band = *band_;
  if (probing_) {
    const double plain = round_ms(pos_, 1, 0), priced = round_ms(pos_, b, verified);
    if ((accepted + 1) * plain > priced) {
      band.plain_left = 0, band.probe_gap = 2;
    } else {
      const double spent = time_weight_ != 0 ? 1000 * seconds : priced;
      const double excess = spent / plain - static_cast<double>(accepted) - 1;
      band.plain_left = std::max(band.plain_left, static_cast<int64_t>(std::ceil(band.plain_left * excess)));
    }
  }
  if (!verified) {
    pending_ = Pending{0, acceptance_, opening_};
    return;
  }
  if (!confidence_.empty()) band.calibration.observe({confidence_.begin(), confidence_.begin() + verified}, accepted);
  for (int64_t i = 0; i < std::min(accepted + 1, verified); ++i) {
    band.position_rate[i] += 0.05 * ((i < accepted ? 1.0 : 0.0) - band.position_rate[i]);
  }
  std::vector<double> row(accepted, 1.0);
  if (accepted < verified) {
    row.resize(acceptance_.size(), 0.0);
  } else {
    row.insert(row.end(), acceptance_.begin() + accepted, acceptance_.end());
  }
  pending_ = Pending{accepted, std::move(row), opening_};
}

}  // namespace dflash
