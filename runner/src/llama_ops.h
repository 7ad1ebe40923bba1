// The two custom operators the exported programs call, `llama::update_cache.out` and
// `llama::custom_sdpa.out`. ExecuTorch ships their kernels only inside its Python extension (which
// links libtorch), so a standalone runner brings its own, with the same semantics.
#pragma once

#include <executorch/runtime/kernel/operator_registry.h>

namespace dflash {

// Both kernels, by operator name.
executorch::runtime::Span<const executorch::runtime::Kernel> llama_kernels();

// Adds both kernels to ExecuTorch's operator registry. Call it once, before loading any program:
// a program that calls an unregistered operator fails to load ("Missing operator").
void register_llama_ops();

}  // namespace dflash
