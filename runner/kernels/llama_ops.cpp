// Kernels of llama::update_cache.out, llama::custom_sdpa.out and llama::gated_delta_rule.out (see llama_ops.h).
//
// Semantics, as ExecuTorch's own kernels (extension/llm/custom_ops) define them:
// - update_cache(value [B,S,H,D], cache [B,S_max,H,D], start_pos): cache[:, start_pos:start_pos+S] = value.
// - custom_sdpa(q [B,Sq,Hq,D], k, v [B,S_max,Hkv,D], start_pos, is_causal, scale): attention of each query
//   over the keys [0, start_pos + Sq) (causal: query m over [0, start_pos + m]); query head h reads kv head
//   h / (Hq / Hkv) (grouped-query attention); scale defaults to 1/sqrt(D). Rollback needs nothing here:
//   keys past start_pos + Sq are never read, so a later call overwrites rejected positions. With an
//   additive attn_mask [Sq, S_max] (sliding-window layers), every query attends over all S_max rows
//   under the mask instead, is_causal must be false, and start_pos may pass S_max (a ring-buffer cache).
// - gated_delta_rule(query [B,Hq,T,Dk], key [B,H,T,Dk], value [B,H,T,Dv], decay [B,H,T] or [B,H,T,Dk], beta [B,H,T],
//   initial_state [B,H,Dk,Dv]), float only: the Gated DeltaNet recurrence, token by token, on a state per head
//   (initial_state is left as it is; the last state goes to final_state_out [B,H,Dk,Dv]). Per token:
//   state *= decay (already exponentiated; one gate per head or one per key channel, i.e. state row);
//   delta = (value - state^T key) * beta; state += key delta^T; output = state^T query (no scale), where query
//   head h reads state head h / (Hq / H).
#include "llama_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include <executorch/runtime/core/event_tracer_hooks.h>
#include <executorch/runtime/core/exec_aten/util/tensor_util.h>
#include <executorch/runtime/kernel/kernel_includes.h>
#include <executorch/runtime/kernel/operator_registry.h>
#include <executorch/runtime/kernel/thread_parallel_interface.h>

namespace dflash {
namespace {

using executorch::aten::ScalarType;
using executorch::aten::Tensor;
using executorch::runtime::Error;
using executorch::runtime::EValue;
using executorch::runtime::KernelRuntimeContext;
using executorch::runtime::Span;

// The operators' names: what each kernel is registered under, says in its errors and is profiled as
constexpr const char* kUpdateCache = "llama::update_cache.out";
constexpr const char* kCustomSdpa = "llama::custom_sdpa.out";
constexpr const char* kGatedDeltaRule = "llama::gated_delta_rule.out";

// Reports a kernel failure: the runtime logs `why` and stops the program's execution with `error`.
bool check(KernelRuntimeContext& ctx, bool ok, const char* op, const char* why) {
  if (!ok) {
    ET_LOG(Error, "%s: %s", op, why);
    ctx.fail(Error::InvalidArgument);
  }
  return ok;
}

void update_cache(KernelRuntimeContext& ctx, Span<EValue*> stack) {
  // stack: value, cache, start_pos, out (unused placeholder), return slot
  const char* op = kUpdateCache;
  executorch::runtime::internal::EventTracerProfileOpScope profiled(ctx.internal_event_tracer(), op);  // in ETDump
  const Tensor& value = stack[0]->toTensor();
  Tensor& cache = stack[1]->toTensor();
  const int64_t start = stack[2]->toInt();
  if (!check(ctx, value.dim() == 4 && cache.dim() == 4, op, "value and cache must be [B, S, H, D]") ||
      !check(ctx, value.scalar_type() == cache.scalar_type(), op, "value and cache differ in dtype") ||
      !check(ctx, value.size(0) == cache.size(0) && value.size(2) == cache.size(2) && value.size(3) == cache.size(3),
             op, "value and cache differ in batch, heads or head size") ||
      !check(ctx, start >= 0 && start + value.size(1) <= cache.size(1), op, "writes past the cache's end") ||
      !check(ctx, executorch::runtime::tensor_is_contiguous(value) && executorch::runtime::tensor_is_contiguous(cache),
             op, "value and cache must be contiguous")) {
    return;
  }
  const size_t row = value.size(2) * value.size(3) * value.element_size();  // one position, all heads
  const auto* src = static_cast<const char*>(value.const_data_ptr());
  auto* dst = static_cast<char*>(cache.mutable_data_ptr());
  for (int64_t b = 0; b < value.size(0); ++b) {
    std::memcpy(dst + (b * cache.size(1) + start) * row, src + b * value.size(1) * row, value.size(1) * row);
  }
}

constexpr int64_t kKeyBlock = 64;  // keys per tile: their K or V tile (64 x head_dim floats) stays in L1
constexpr int64_t kRowBlock = 16;  // query rows (of one kv head's group) per task
constexpr int64_t kLanes = 16;     // partial sums of a softmax's denominator, added in a fixed order

// exp(x) for the softmax (x <= 0): 2^n exp(r), n = round(x / ln 2), exp(r) by Cephes' polynomial (~1 ulp), 0 below
// -87. Plain arithmetic (no floor, which GCC does not vectorize), so that a loop of it is vectorized; which elements
// the vector code takes depends on the row's length alone, so a row's bits do not depend on the call.
inline float softmax_exp(float x) {
  const float n = (x * 1.44269504088896341f + 12582912.f) - 12582912.f;  // rounded by adding 1.5 * 2^23
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float y = 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * r * r + r + 1.f;
  const float two_n = __builtin_bit_cast(float, (static_cast<int32_t>(std::max(n, -126.f)) + 127) << 23);
  return x < -87.f ? 0.f : y * two_n;
}

// Attention of `rows` query rows [first, first + rows) of kv head `kv`'s group in batch `b`, in float
// whatever the tensors' dtype. Row r of the group is query m = r / group of head kv * group + r % group,
// so each K and V tile is read once for every query head that shares it. Scores are tiled: a tile of K
// is transposed so that the inner loop runs over keys, which the compiler vectorizes without horizontal sums;
// then each row's softmax, then P V tile by tile. A row's numbers come from its own query, keys and values in the
// same order whatever else the call holds (no reduction the compiler may reorder: kLanes partial sums, keys in
// order), so a verify's rows are one-token calls' bit for bit: greedy decoding's exactness needs it.
template <typename T>
void attend(const Tensor& q, const Tensor& k, const Tensor& v, const T* mask, Tensor& out, int64_t start, bool causal,
            float scale, int64_t b, int64_t kv, int64_t first, int64_t rows) {
  const int64_t sq = q.size(1), hq = q.size(2), d = q.size(3), s_max = k.size(1), hkv = k.size(2);
  const int64_t group = hq / hkv, keys = mask ? s_max : start + sq;
  const T* kp = k.const_data_ptr<T>() + (b * s_max * hkv + kv) * d;  // key j at kp + j * hkv * d
  const T* vp = v.const_data_ptr<T>() + (b * s_max * hkv + kv) * d;
  // per thread, kept between calls: a verify's scores (rows x keys) would cost page faults if allocated each time
  thread_local std::vector<float> kept_query, kept_scores, kept_tile, kept_acc;
  kept_query.resize(rows * d), kept_scores.resize(rows * keys), kept_tile.resize(d * kKeyBlock);
  kept_acc.assign(rows * d, 0.f);
  float *query = kept_query.data(), *scores = kept_scores.data(), *tile = kept_tile.data(), *acc = kept_acc.data();
  float total[kRowBlock] = {};
  int64_t seen[kRowBlock], offset[kRowBlock];  // keys each row attends to; where it lives in q and out
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t m = (first + r) / group, h = kv * group + (first + r) % group;
    seen[r] = causal ? start + m + 1 : keys;
    offset[r] = ((b * sq + m) * hq + h) * d;
    const T* qrow = q.const_data_ptr<T>() + offset[r];
    for (int64_t i = 0; i < d; ++i) query[r * d + i] = static_cast<float>(qrow[i]) * scale;
  }
  for (int64_t j0 = 0; j0 < keys; j0 += kKeyBlock) {
    const int64_t n = std::min(kKeyBlock, keys - j0);
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t i = 0; i < d; ++i) tile[i * kKeyBlock + j] = static_cast<float>(kp[(j0 + j) * hkv * d + i]);
    }
    for (int64_t r = 0; r < rows; ++r) {
      if (j0 >= seen[r]) continue;
      float dots[kKeyBlock] = {};
      for (int64_t i = 0; i < d; ++i) {
        const float qi = query[r * d + i];
        const float* t = &tile[i * kKeyBlock];
#pragma omp simd
        for (int64_t j = 0; j < kKeyBlock; ++j) dots[j] += qi * t[j];
      }
      std::copy(dots, dots + n, &scores[r * keys + j0]);
      if (mask) {
        const T* m = mask + (first + r) / group * keys + j0;
        for (int64_t j = 0; j < n; ++j) scores[r * keys + j0 + j] += static_cast<float>(m[j]);
      }
    }
  }
  for (int64_t r = 0; r < rows; ++r) {  // scores become exp(score - the row's max), and their sum
    float* row = &scores[r * keys];
    const int64_t n = seen[r];
    const float best = *std::max_element(row, row + n);
    for (int64_t j = 0; j < n; ++j) row[j] = softmax_exp(row[j] - best);
    float lanes[kLanes] = {};
    int64_t j = 0;
    for (; j + kLanes <= n; j += kLanes) {
      for (int64_t l = 0; l < kLanes; ++l) lanes[l] += row[j + l];
    }
    for (int64_t l = 0; j + l < n; ++l) lanes[l] += row[j + l];
    for (int64_t l = 0; l < kLanes; ++l) total[r] += lanes[l];
  }
  for (int64_t j0 = 0; j0 < keys; j0 += kKeyBlock) {  // P V, one V tile (in L1) for every row
    for (int64_t r = 0; r < rows; ++r) {
      const float* p = &scores[r * keys];
      float* a = &acc[r * d];
      const int64_t end = std::min(j0 + kKeyBlock, seen[r]);
      for (int64_t j = j0; j < end; ++j) {
        const T* vrow = vp + j * hkv * d;
        const float pj = p[j];
#pragma omp simd
        for (int64_t i = 0; i < d; ++i) a[i] += pj * static_cast<float>(vrow[i]);
      }
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    T* orow = out.mutable_data_ptr<T>() + offset[r];
    for (int64_t i = 0; i < d; ++i) orow[i] = static_cast<T>(acc[r * d + i] / total[r]);
  }
}

void custom_sdpa(KernelRuntimeContext& ctx, Span<EValue*> stack) {
  // stack: q, k, v, start_pos, attn_mask, dropout_p, is_causal, scale, out, return slot
  const char* op = kCustomSdpa;
  executorch::runtime::internal::EventTracerProfileOpScope profiled(ctx.internal_event_tracer(), op);  // in ETDump
  const Tensor& q = stack[0]->toTensor();
  const Tensor& k = stack[1]->toTensor();
  const Tensor& v = stack[2]->toTensor();
  const int64_t start = stack[3]->toInt();
  const bool causal = stack[6]->toBool();
  Tensor& out = stack[8]->toTensor();
  const bool masked = !stack[4]->isNone();
  if (!check(ctx, stack[5]->toDouble() == 0.0, op, "dropout is not supported") ||
      !check(ctx, !(masked && causal), op, "attn_mask and is_causal cannot both be set") ||
      !check(ctx, !masked || (stack[4]->toTensor().dim() == 2 && stack[4]->toTensor().size(0) == q.size(1) &&
                              stack[4]->toTensor().size(1) == k.size(1) &&
                              stack[4]->toTensor().scalar_type() == q.scalar_type() &&
                              executorch::runtime::tensor_is_contiguous(stack[4]->toTensor())),
             op, "attn_mask must be [queries, cache length], contiguous, in q's dtype") ||
      !check(ctx, q.dim() == 4 && k.dim() == 4 && v.dim() == 4, op, "q, k and v must be [B, S, H, D]") ||
      !check(ctx, k.sizes() == v.sizes() && q.size(0) == k.size(0) && q.size(3) == k.size(3), op,
             "q, k and v differ in batch or head size") ||
      !check(ctx, k.size(2) > 0 && q.size(2) % k.size(2) == 0, op, "query heads must be a multiple of kv heads") ||
      !check(ctx, q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type(), op,
             "q, k and v differ in dtype") ||
      !check(ctx, masked || (start >= 0 && start + q.size(1) <= k.size(1)), op, "reads past the cache's end") ||
      !check(ctx, executorch::runtime::tensor_is_contiguous(q) && executorch::runtime::tensor_is_contiguous(k) &&
                      executorch::runtime::tensor_is_contiguous(v), op, "q, k and v must be contiguous") ||
      !check(ctx, executorch::runtime::resize_tensor(out, q.sizes()) == Error::Ok, op, "cannot resize out")) {
    return;
  }
  const float scale = stack[7]->isNone() ? 1.f / std::sqrt(static_cast<float>(q.size(3)))
                                          : static_cast<float>(stack[7]->toDouble());
  // tasks: (batch, kv head, block of kRowBlock rows of that kv head's group of query rows)
  const int64_t group_rows = q.size(1) * (q.size(2) / k.size(2));
  const int64_t blocks = (group_rows + kRowBlock - 1) / kRowBlock, tasks = q.size(0) * k.size(2) * blocks;
  auto run = [&](auto zero) {
    using T = decltype(zero);
    executorch::extension::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t task = begin; task < end; ++task) {
        const int64_t b = task / (k.size(2) * blocks), kv = task / blocks % k.size(2), block = task % blocks;
        const int64_t first = block * kRowBlock;
        const T* mask = masked ? stack[4]->toTensor().const_data_ptr<T>() : nullptr;
        attend<T>(q, k, v, mask, out, start, causal, scale, b, kv, first, std::min(kRowBlock, group_rows - first));
      }
    });
  };
  switch (q.scalar_type()) {
    case ScalarType::Float: run(float{}); break;
    case ScalarType::BFloat16: run(executorch::aten::BFloat16{}); break;
    case ScalarType::Half: run(executorch::aten::Half{}); break;
    default: check(ctx, false, op, "dtype must be float, bfloat16 or half");
  }
}

void gated_delta_rule(KernelRuntimeContext& ctx, Span<EValue*> stack) {
  // stack: query, key, value, decay, beta, initial_state, out, final_state_out, return slot (a list of both outs)
  const char* op = kGatedDeltaRule;
  executorch::runtime::internal::EventTracerProfileOpScope profiled(ctx.internal_event_tracer(), op);  // in ETDump
  const Tensor& q = stack[0]->toTensor();
  const Tensor& k = stack[1]->toTensor();
  const Tensor& v = stack[2]->toTensor();
  const Tensor& decay = stack[3]->toTensor();
  const Tensor& beta = stack[4]->toTensor();
  const Tensor& initial = stack[5]->toTensor();
  Tensor& out = stack[6]->toTensor();
  Tensor& state = stack[7]->toTensor();
  bool floats = true, contiguous = true;
  for (size_t i = 0; i < 8; ++i) {
    floats = floats && stack[i]->toTensor().scalar_type() == ScalarType::Float;
    contiguous = contiguous && executorch::runtime::tensor_is_contiguous(stack[i]->toTensor());
  }
  if (!check(ctx, q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && initial.dim() == 4 && beta.dim() == 3 &&
                      (decay.dim() == 3 || decay.dim() == 4), op,
             "query, key, value and initial_state must be 4-dim, beta 3-dim, decay 3- or 4-dim") ||
      !check(ctx, floats, op, "every tensor must be float") ||
      !check(ctx, contiguous, op, "every tensor must be contiguous")) {
    return;
  }
  const int64_t batch = k.size(0), heads = k.size(1), tokens = k.size(2), dk = k.size(3), dv = v.size(3);
  const int64_t hq = q.size(1);
  auto per_token = [&](const Tensor& t) { return t.size(0) == batch && t.size(1) == heads && t.size(2) == tokens; };
  using Size = executorch::aten::SizesType;
  const Size out_sizes[] = {Size(batch), Size(hq), Size(tokens), Size(dv)};
  if (!check(ctx, q.size(0) == batch && q.size(2) == tokens && q.size(3) == dk, op,
             "query and key differ in batch, tokens or head size") ||
      !check(ctx, per_token(v) && per_token(beta) && per_token(decay) && (decay.dim() == 3 || decay.size(3) == dk), op,
             "value, beta and decay must match key's batch, heads and tokens (and a 4-dim decay its head size)") ||
      !check(ctx, heads > 0 && hq % heads == 0, op, "query heads must be a multiple of key heads") ||
      !check(ctx, initial.size(0) == batch && initial.size(1) == heads && initial.size(2) == dk && initial.size(3) == dv,
             op, "initial_state must be [B, H, Dk, Dv]") ||
      !check(ctx, executorch::runtime::resize_tensor(out, {out_sizes, 4}) == Error::Ok &&
                      executorch::runtime::resize_tensor(state, initial.sizes()) == Error::Ok,
             op, "cannot resize out or final_state_out")) {
    return;
  }
  const float *qp = q.const_data_ptr<float>(), *kp = k.const_data_ptr<float>(), *vp = v.const_data_ptr<float>();
  const float *gp = decay.const_data_ptr<float>(), *bp = beta.const_data_ptr<float>();
  const float* init = initial.const_data_ptr<float>();
  float *outp = out.mutable_data_ptr<float>(), *sp = state.mutable_data_ptr<float>();
  const int64_t group = hq / heads;
  const bool channelwise = decay.dim() == 4;
  // tasks: (batch, state head), each owning its state [Dk, Dv] (row i: key channel i), updated in place in
  // final_state_out (two passes over it per token), and the outputs of its group of query heads
  executorch::extension::parallel_for(0, batch * heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> delta(dv);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / heads, h = task % heads;
      float* s = sp + task * dk * dv;
      if (s != init + task * dk * dv) std::memcpy(s, init + task * dk * dv, dk * dv * sizeof(float));
      for (int64_t t = 0; t < tokens; ++t) {
        const int64_t row = task * tokens + t;  // (b, h, t) in key, value, decay and beta
        const float* kt = kp + row * dk;
        const float* g = gp + (channelwise ? row * dk : row);
        // decay the state, and gather its prediction for this key's value, state^T key, in delta
        std::fill(delta.begin(), delta.end(), 0.f);
        for (int64_t i = 0; i < dk; ++i) {
          const float gi = g[channelwise ? i : 0], ki = kt[i];
          float* si = s + i * dv;
#pragma omp simd
          for (int64_t j = 0; j < dv; ++j) {
            si[j] *= gi;
            delta[j] += ki * si[j];
          }
        }
        const float* vt = vp + row * dv;
        for (int64_t j = 0; j < dv; ++j) delta[j] = (vt[j] - delta[j]) * bp[row];
        // state += key delta^T, and each query head of the group reads the updated rows: out += q_i state_i
        const int64_t first = (b * hq + h * group) * tokens + t;  // (b, h * group, t) in query and out
        for (int64_t m = 0; m < group; ++m) std::fill_n(outp + (first + m * tokens) * dv, dv, 0.f);
        for (int64_t i = 0; i < dk; ++i) {
          const float ki = kt[i];
          float* si = s + i * dv;
#pragma omp simd
          for (int64_t j = 0; j < dv; ++j) si[j] += ki * delta[j];
          for (int64_t m = 0; m < group; ++m) {
            const float qi = qp[(first + m * tokens) * dk + i];
            float* o = outp + (first + m * tokens) * dv;
#pragma omp simd
            for (int64_t j = 0; j < dv; ++j) o[j] += qi * si[j];
          }
        }
      }
    }
  });
}

}  // namespace

executorch::runtime::Span<const executorch::runtime::Kernel> llama_kernels() {
  static const executorch::runtime::Kernel kernels[] = {
      executorch::runtime::Kernel(kUpdateCache, update_cache),
      executorch::runtime::Kernel(kCustomSdpa, custom_sdpa),
      executorch::runtime::Kernel(kGatedDeltaRule, gated_delta_rule),
  };
  return {kernels, 3};
}

void register_llama_ops() {
  static const bool registered = [] {
    const Error error = executorch::runtime::register_kernels(llama_kernels());
    ET_CHECK_MSG(error == Error::Ok, "registering the llama kernels failed");
    return true;
  }();
  (void)registered;
}

// Kernel keys: "v1/" then each tensor of the call's arguments (the return slot's too), in the schema's order, as
// "<ScalarType>;<dim order>", joined by '|' (ExecuTorch's make_kernel_key_string). Contiguous float, bfloat16 and
// half tensors: what the programs' calls pass (q, k, v, [attn_mask,] out, out again as the returned value;
// gated_delta_rule's eight, with a 3- or 4-dim decay, and a list as its returned value).
#define DFLASH_4D(t) t ";0,1,2,3"
#define DFLASH_SDPA_KEYS(t)                                                                                  \
  "v1/" DFLASH_4D(t) "|" DFLASH_4D(t) "|" DFLASH_4D(t) "|" DFLASH_4D(t) "|" DFLASH_4D(t),                     \
      "v1/" DFLASH_4D(t) "|" DFLASH_4D(t) "|" DFLASH_4D(t) "|" t ";0,1" "|" DFLASH_4D(t) "|" DFLASH_4D(t)
#define DFLASH_DELTA_KEY(decay)                                                                  \
  "v1/" DFLASH_4D("6") "|" DFLASH_4D("6") "|" DFLASH_4D("6") "|" decay "|6;0,1,2|" DFLASH_4D("6") "|" \
      DFLASH_4D("6") "|" DFLASH_4D("6")

void register_llama_ops_keyed() {
  static const bool registered = [] {
    using executorch::runtime::Kernel;
    using executorch::runtime::KernelKey;
    static constexpr const char* sdpa_keys[] = {DFLASH_SDPA_KEYS("6"), DFLASH_SDPA_KEYS("15"), DFLASH_SDPA_KEYS("5")};
    static constexpr const char* delta_keys[] = {DFLASH_DELTA_KEY("6;0,1,2"), DFLASH_DELTA_KEY("6;0,1,2,3")};
    static std::vector<Kernel> kernels;
    for (const char* key : sdpa_keys) kernels.emplace_back(kCustomSdpa, KernelKey(key), custom_sdpa);
    for (const char* key : delta_keys) {
      kernels.emplace_back(kGatedDeltaRule, KernelKey(key), gated_delta_rule);
    }
    const Error error = executorch::runtime::register_kernels({kernels.data(), kernels.size()});
    ET_CHECK_MSG(error == Error::Ok, "registering the keyed llama kernels failed");
    return true;
  }();
  (void)registered;
}

}  // namespace dflash

extern "C" void dflash_register_llama_ops_keyed() { dflash::register_llama_ops_keyed(); }
