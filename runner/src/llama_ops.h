// The custom operators the exported programs call: `llama::update_cache.out`, `llama::custom_sdpa.out`
// and, in hybrid (Gated DeltaNet) targets, `llama::gated_delta_rule.out`. ExecuTorch ships their kernels
// only inside its Python extension (which links libtorch), so a standalone runner brings its own, with the
// same semantics.
#pragma once

#include <executorch/runtime/kernel/operator_registry.h>

namespace dflash {

// All three kernels, by operator name.
executorch::runtime::Span<const executorch::runtime::Kernel> llama_kernels();

// Adds the kernels to ExecuTorch's operator registry. Call it once, before loading any program:
// a program that calls an unregistered operator fails to load ("Missing operator").
void register_llama_ops();

}  // namespace dflash
