#include "cost_curve.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

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

// The curve's fields, checked to fit together; std::runtime_error (or nlohmann's) saying what is wrong otherwise.
CostCurve from_json(const nlohmann::json& j) {
  for (const auto& [key, value] : j.items()) {
    static const std::set<std::string> known{"positions", "target_ms", "draft_ms", "programs", "confidence_ms"};
    if (!known.count(key)) throw std::runtime_error("unexpected field " + key);
  }
  CostCurve curve;
  j.at("positions").get_to(curve.positions);
  j.at("target_ms").get_to(curve.target_ms);
  j.at("draft_ms").get_to(curve.draft_ms);
  curve.programs = j.value("programs", "");
  curve.confidence_ms = j.value("confidence_ms", 0.0);
  const size_t n = curve.positions.size();
  if (!n || curve.target_ms.size() != n || curve.draft_ms.size() != n || curve.target_ms[0].size() < 2 ||
      !std::is_sorted(curve.positions.begin(), curve.positions.end())) {
    throw std::runtime_error("positions, target_ms and draft_ms do not match");
  }
  for (size_t p = 0; p < n; ++p) {
    if (curve.target_ms[p].size() != curve.target_ms[0].size() ||
        curve.draft_ms[p].size() + 1 != curve.target_ms[0].size()) {
      throw std::runtime_error("the rows of target_ms and draft_ms differ in length");
    }
  }
  return curve;
}

UserError not_a_curve(const std::string& source, std::string why) {
  std::replace(why.begin(), why.end(), '\n', ' ');
  if (why.rfind("[json.exception.", 0) == 0) why.erase(0, why.find("] ") + 2);  // nlohmann's error id: not for users
  return UserError(source + " is not a cost curve (" + why + "); the bench stage writes one "
                   "(reports/cost_curve.json), or leave it out to measure one at load");
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

// Per length, the mean of the middle half of its times, then no length dearer than a longer one.
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
  return nlohmann::json{{"positions", positions}, {"target_ms", target_ms}, {"draft_ms", draft_ms},
                        {"programs", programs}, {"confidence_ms", confidence_ms}}.dump();
}

CostCurve CostCurve::parse(const std::string& text, const std::string& source) {
  try {
    return from_json(nlohmann::json::parse(text));
  } catch (const std::exception& e) {  // nlohmann's errors and from_json's
    throw not_a_curve(source, e.what());
  }
}

CostCurve CostCurve::load(const std::string& path, const std::string& programs) {
  std::ifstream in(path);
  if (!in) throw not_a_curve(path, "it cannot be read");
  std::stringstream text;
  text << in.rdbuf();
  const CostCurve curve = parse(text.str(), path);
  if (curve.programs != programs) {
    throw UserError(path + " was measured on other programs than these; rerun the bench stage for them, "
                    "or leave it out to measure one at load");
  }
  return curve;
}

std::string programs_identity(const std::vector<int64_t>& parts) {
  std::string out;
  for (const int64_t part : parts) out += (out.empty() ? "" : ":") + std::to_string(part);
  return out;
}

std::vector<double> confidence(const float* logits, int64_t rows, int64_t vocab) {
  std::vector<double> out(rows);
  for (int64_t r = 0; r < rows; ++r) {  // softmax's largest value: e^0 over the sum
    const float* row = logits + r * vocab;
    const float best = *std::max_element(row, row + vocab);
    float sum = 0;
    for (int64_t i = 0; i < vocab; ++i) sum += std::exp(row[i] - best);
    out[r] = 1.f / sum;
  }
  return out;
}

Sweep::Sweep(int64_t max_block, int64_t per_block, bool descending) : max_block_(max_block) {
  for (int64_t i = 0; i < max_block; ++i) blocks.insert(blocks.end(), per_block, descending ? max_block - i : i + 1);
}

int64_t Sweep::block(int64_t pos, int64_t room) {
  ++rounds_;
  return rounds_ <= static_cast<int64_t>(blocks.size()) ? std::min(blocks[rounds_ - 1], room) : 1;
}

int64_t Sweep::verify_count(const float* logits, int64_t rows, int64_t vocab, int64_t pos) {
  if (rows == max_block_ - 1) {
    const double t0 = now();
    confidence(logits, rows, vocab);
    confidence_ms.push_back(1000 * (now() - t0));
  }
  return rows;
}

CostSweep::CostSweep(int64_t max_block, int64_t max_seq_len, int64_t repeats)
    : max_block_(max_block),
      repeats_(repeats),
      per_block_(std::max<int64_t>(1, std::min<int64_t>(3, (max_seq_len - 1) / max_block))),  // fewer in a small cache
      span_(per_block_ * max_block),  // positions a sweep moves on, one per round
      both_(max_seq_len - span_ - max_block >= 1) {  // room for an ascending sweep: its last block ends max_block on
  const int64_t last = std::max<int64_t>(max_seq_len - span_ - both_ * max_block, 1);
  const std::set<int64_t> at{std::min<int64_t>(64, last), std::max<int64_t>(last / 2, 1), last};
  starts.assign(at.begin(), at.end());
  tokens = span_ + both_ * max_block + 1;
  target_times_.assign(starts.size(), std::vector<std::vector<double>>(max_block));
  draft_times_.assign(starts.size(), std::vector<std::vector<double>>(max_block - 1));
}

Sweep CostSweep::planner(int64_t sweep) const { return Sweep(max_block_, per_block_, !both_ || sweep % 2 == 1); }

void CostSweep::record(size_t start, int64_t sweep, const Sweep& plan, const std::vector<double>& verify_s,
                       const std::vector<double>& draft_s) {
  if (!sweep) return;  // the warm-up
  for (size_t i = 0; i < std::min(plan.blocks.size(), verify_s.size()); ++i) {
    if (i % per_block_ == 0 && per_block_ > 1) continue;  // the first round of each block: shapes change there
    const int64_t b = plan.blocks[i];
    target_times_[start][b - 1].push_back(1000 * verify_s[i]);
    if (b > 1) draft_times_[start][b - 2].push_back(1000 * draft_s[i]);
  }
  confidence_ms_.insert(confidence_ms_.end(), plan.confidence_ms.begin(), plan.confidence_ms.end());
}

CostCurve CostSweep::curve(const std::string& programs) const {
  CostCurve curve;
  for (size_t s = 0; s < starts.size(); ++s) {
    curve.positions.push_back(starts[s] + span_ / 2);  // each measured at its sweep's mean position
    curve.target_ms.push_back(typical(target_times_[s]));
    curve.draft_ms.push_back(typical(draft_times_[s]));
  }
  curve.programs = programs;
  curve.confidence_ms = confidence_ms_.empty() ? 0.0 : median(confidence_ms_);
  return curve;
}

}  // namespace dflash
