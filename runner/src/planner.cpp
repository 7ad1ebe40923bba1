#include "planner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>

#include "errors.h"

namespace dflash {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

namespace {

// np.interp(x, xp, fp) for increasing xp: the end values outside, fp[j] at xp[j], else the line between.
double interp(double x, const std::vector<int64_t>& xp, const std::vector<double>& fp) {
  if (x <= xp.front()) return fp.front();
  if (x >= xp.back()) return fp.back();
  size_t j = std::upper_bound(xp.begin(), xp.end(), x) - xp.begin() - 1;
  if (xp[j] == x) return fp[j];
  const double slope = (fp[j + 1] - fp[j]) / static_cast<double>(xp[j + 1] - xp[j]);
  return slope * (x - xp[j]) + fp[j];
}

// What a cost curve file holds: JSON numbers, strings (no escapes but \" and \\), lists and one object.
struct Json {
  double number = 0;
  std::string text;
  std::vector<Json> items;
  std::vector<std::pair<std::string, Json>> fields;
};

class JsonReader {
 public:
  explicit JsonReader(const std::string& s) : s_(s) {}

  Json document() {
    Json value = read();
    skip();
    if (i_ != s_.size()) fail("the end");
    return value;
  }

 private:
  [[noreturn]] void fail(const std::string& expected) const {
    throw std::runtime_error("expected " + expected + " at character " + std::to_string(i_));
  }
  void skip() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  bool next_is(char c) {
    skip();
    if (i_ < s_.size() && s_[i_] == c) return ++i_, true;
    return false;
  }
  void expect(char c) {
    if (!next_is(c)) fail(std::string("'") + c + "'");
  }
  std::string string() {
    expect('"');
    std::string out;
    while (i_ < s_.size() && s_[i_] != '"') out += s_[i_] == '\\' ? s_[++i_] : s_[i_], ++i_;
    expect('"');
    return out;
  }
  Json read() {
    Json value;
    skip();
    if (i_ < s_.size() && s_[i_] == '"') {
      value.text = string();
    } else if (next_is('[')) {
      if (!next_is(']')) {
        do value.items.push_back(read());
        while (next_is(','));
        expect(']');
      }
    } else if (next_is('{')) {
      if (!next_is('}')) {
        do {
          std::string key = string();
          expect(':');
          value.fields.emplace_back(key, read());
        } while (next_is(','));
        expect('}');
      }
    } else {
      const char* start = s_.c_str() + i_;
      char* end = nullptr;
      value.number = std::strtod(start, &end);
      if (end == start) fail("a value");
      i_ += end - start;
    }
    return value;
  }

  const std::string& s_;
  size_t i_ = 0;
};

std::vector<double> numbers(const Json& list) {
  std::vector<double> out;
  for (const Json& item : list.items) out.push_back(item.number);
  return out;
}

std::vector<std::vector<double>> rows(const Json& list) {
  std::vector<std::vector<double>> out;
  for (const Json& item : list.items) out.push_back(numbers(item));
  return out;
}

// The curve's fields; a std::runtime_error saying what is wrong otherwise.
CostCurve parse(const std::string& text) {
  CostCurve curve;
  bool positions = false, target = false, draft = false;
  for (const auto& [key, value] : JsonReader(text).document().fields) {
    if (key == "positions") {
      for (double p : numbers(value)) curve.positions.push_back(static_cast<int64_t>(p));
      positions = true;
    } else if (key == "target_ms") {
      curve.target_ms = rows(value), target = true;
    } else if (key == "draft_ms") {
      curve.draft_ms = rows(value), draft = true;
    } else if (key == "programs") {
      curve.programs = value.text;
    } else if (key == "confidence_ms") {
      curve.confidence_ms = value.number;
    } else {
      throw std::runtime_error("unexpected field " + key);
    }
  }
  if (!positions || !target || !draft) throw std::runtime_error("positions, target_ms and draft_ms are required");
  const size_t n = curve.positions.size();
  if (!n || curve.target_ms.size() != n || curve.draft_ms.size() != n || curve.target_ms[0].size() < 2 ||
      !std::is_sorted(curve.positions.begin(), curve.positions.end())) {
    throw std::runtime_error("positions, target_ms and draft_ms do not match");
  }
  const size_t lengths = curve.target_ms[0].size();
  for (size_t p = 0; p < n; ++p) {
    if (curve.target_ms[p].size() != lengths || curve.draft_ms[p].size() + 1 != lengths) {
      throw std::runtime_error("the rows of target_ms and draft_ms differ in length");
    }
  }
  return curve;
}

std::string json_list(const std::vector<double>& values) {
  std::ostringstream out;
  out.precision(17);
  out << "[";
  for (size_t i = 0; i < values.size(); ++i) out << (i ? ", " : "") << values[i];
  return out.str() + "]";
}

std::string json_rows(const std::vector<std::vector<double>>& rows) {
  std::string out = "[";
  for (size_t i = 0; i < rows.size(); ++i) out += (i ? ", " : "") + json_list(rows[i]);
  return out + "]";
}

// [by * e for e in row]
std::vector<double> scaled(const std::vector<double>& row, double by) {
  std::vector<double> out;
  for (double e : row) out.push_back(by * e);
  return out;
}

}  // namespace

double CostCurve::target(int64_t tokens, int64_t pos) const {
  std::vector<double> column;
  for (const auto& row : target_ms) column.push_back(row[tokens - 1]);
  return interp(pos, positions, column);
}

double CostCurve::draft(int64_t block, int64_t pos) const {
  std::vector<double> column;
  for (const auto& row : draft_ms) column.push_back(row[block - 2]);
  return interp(pos, positions, column);
}

std::string CostCurve::to_json() const {
  std::ostringstream out;
  out.precision(17);
  out << "{\"positions\": [";
  for (size_t i = 0; i < positions.size(); ++i) out << (i ? ", " : "") << positions[i];
  out << "], \"target_ms\": " << json_rows(target_ms) << ", \"draft_ms\": " << json_rows(draft_ms)
      << ", \"programs\": \"" << programs << "\", \"confidence_ms\": " << confidence_ms << "}";
  return out.str();
}

CostCurve CostCurve::load(const std::string& path, const std::string& programs) {
  CostCurve curve;
  try {
    std::ifstream in(path);
    if (!in) throw std::runtime_error("it cannot be read");
    std::stringstream text;
    text << in.rdbuf();
    curve = parse(text.str());
  } catch (const std::runtime_error& e) {
    throw UserError(path + " is not a cost curve (" + e.what() + "); the bench stage writes one "
                    "(reports/cost_curve.json), or leave it out to measure one at load");
  }
  if (curve.programs != programs) {
    throw UserError(path + " was measured on other programs than these; rerun the bench stage for them, "
                    "or leave it out to measure one at load");
  }
  return curve;
}

std::vector<double> confidence(const float* logits, int64_t rows, int64_t vocab) {
  std::vector<double> out(rows);
  for (int64_t r = 0; r < rows; ++r) {  // softmax's largest value: e^0 over the sum, in floats as torch's
    const float* row = logits + r * vocab;
    const float best = *std::max_element(row, row + vocab);
    float sum = 0;
    for (int64_t i = 0; i < vocab; ++i) sum += std::exp(row[i] - best);
    out[r] = 1.f / sum;
  }
  return out;
}

std::vector<double> typical(const std::vector<std::vector<double>>& times) {
  std::vector<double> out;
  for (std::vector<double> v : times) {
    std::sort(v.begin(), v.end());
    const size_t quarter = v.size() / 4;
    double sum = 0;
    for (size_t i = quarter; i < v.size() - quarter; ++i) sum += v[i];
    out.push_back(sum / (v.size() - 2 * quarter));
  }
  for (size_t i = out.size(); --i > 0;) out[i - 1] = std::min(out[i - 1], out[i]);
  return out;
}

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

AdaptivePlanner::AdaptivePlanner(CostCurve curve, int64_t max_block, size_t window, size_t react,
                                 int64_t max_probe_gap, double time_weight)
    : curve_(std::move(curve)),
      max_block_(std::min(max_block, curve_.max_block())),
      first_(Calibration(), std::vector<double>(max_block_ - 1, 0.9),
             expected_tokens(std::vector<double>(max_block_ - 1, 0.9)),
             expected_tokens(std::vector<double>(max_block_ - 1, 0.9)), window, react, max_block_),
      band_(&first_),
      max_probe_gap_(max_probe_gap),
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
  return block;
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
    band.probe_gap = std::min(2 * band.probe_gap, max_probe_gap_);
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
