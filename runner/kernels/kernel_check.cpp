// A C entry point to each registered llama kernel, so that the tests can compare them with ExecuTorch's
// reference ops (torch.ops.llama.*) on tensors from Python (ctypes). Each call looks its kernel up by
// operator name and calls it boxed, as a program does, but in this library's own kernel list: a Python
// process that loaded ExecuTorch's own llama kernels has those names in the global registry already. Tensors are contiguous; `dtype` is the ScalarType code (6 float,
// 15 bfloat16); `sizes` point to 4 dims [B, S, H, D] unless said otherwise. Returns 0, or the kernel's error code.
#include <cmath>
#include <vector>

#include <executorch/extension/tensor/tensor_ptr_maker.h>
#include <executorch/runtime/kernel/kernel_runtime_context.h>
#include <executorch/runtime/kernel/operator_registry.h>
#include <executorch/runtime/platform/runtime.h>

#include "llama_ops.h"

namespace {

using executorch::extension::TensorPtr;
using executorch::runtime::Error;
using executorch::runtime::EValue;

TensorPtr tensor(const void* data, const int64_t* sizes, int dtype, int dims = 4) {
  return executorch::extension::from_blob(const_cast<void*>(data),
                                          std::vector<executorch::aten::SizesType>(sizes, sizes + dims),
                                          static_cast<executorch::aten::ScalarType>(dtype));
}

int call(const char* op, std::vector<EValue> stack) {
  executorch::runtime::runtime_init();
  auto fn = executorch::runtime::get_op_function_from_registry(op, {}, dflash::llama_kernels());
  if (!fn.ok()) return static_cast<int>(fn.error());
  std::vector<EValue*> pointers;
  for (auto& v : stack) pointers.push_back(&v);
  executorch::runtime::KernelRuntimeContext ctx;
  (*fn)(ctx, {pointers.data(), pointers.size()});
  return static_cast<int>(ctx.failure_state());
}

}  // namespace

extern "C" int dflash_update_cache(const void* value, const int64_t* value_sizes, void* cache,
                                   const int64_t* cache_sizes, int64_t start_pos, int dtype) {
  auto v = tensor(value, value_sizes, dtype), c = tensor(cache, cache_sizes, dtype);
  float placeholder = 0;
  auto out = executorch::extension::from_blob(&placeholder, {1});
  return call("llama::update_cache.out", {EValue(*v), EValue(*c), EValue(start_pos), EValue(*out), EValue(*out)});
}

// scale NaN: the kernel's default, 1/sqrt(D); mask null: none, else [Sq, S_max] in q's dtype
extern "C" int dflash_custom_sdpa(const void* q, const int64_t* q_sizes, const void* k, const void* v,
                                  const int64_t* kv_sizes, const void* mask, int64_t start_pos, int is_causal,
                                  double scale, void* out, int dtype) {
  auto qt = tensor(q, q_sizes, dtype), kt = tensor(k, kv_sizes, dtype), vt = tensor(v, kv_sizes, dtype);
  auto ot = tensor(out, q_sizes, dtype);
  auto mt = executorch::extension::from_blob(const_cast<void*>(mask), {int32_t(q_sizes[1]), int32_t(kv_sizes[1])},
                                             static_cast<executorch::aten::ScalarType>(dtype));
  return call("llama::custom_sdpa.out", {EValue(*qt), EValue(*kt), EValue(*vt), EValue(start_pos),
                                         mask ? EValue(*mt) : EValue(),
                                         EValue(0.0), EValue(bool(is_causal)), std::isnan(scale) ? EValue() : EValue(scale),
                                         EValue(*ot), EValue(*ot)});
}

// The 8 tensors of the schema, in its order: query, key, value, decay, beta, initial_state, out,
// final_state_out; tensor i has dims[i] sizes at sizes[i] and the ScalarType code dtypes[i].
extern "C" int dflash_gated_delta_rule(void* const* data, const int64_t* const* sizes, const int* dims,
                                       const int* dtypes) {
  std::vector<TensorPtr> t;
  for (int i = 0; i < 8; ++i) t.push_back(tensor(data[i], sizes[i], dtypes[i], dims[i]));
  return call("llama::gated_delta_rule.out", {EValue(*t[0]), EValue(*t[1]), EValue(*t[2]), EValue(*t[3]),
                                              EValue(*t[4]), EValue(*t[5]), EValue(*t[6]), EValue(*t[7]),
                                              EValue()});  // the return slot: the kernel leaves it alone
}
