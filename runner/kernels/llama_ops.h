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

// Adds custom_sdpa's and gated_delta_rule's kernels to the registry under kernel keys (the contiguous float,
// bfloat16 and half tensors the programs pass), which a program prefers to a kernel registered without one:
// so in a process that registered ExecuTorch's own kernels of these operators (the Python runtime, through the
// executorch wheel), the programs still run these. Their rows do not depend on how many a call has (each query row
// is computed alone, its keys in the same order), which greedy decoding's exactness needs: ExecuTorch's
// custom_sdpa tiles queries, so a verify's rows differ from one-token calls' in the last bits, and 8-bit
// activations turn those bits into other tokens. Call it once (also C: dflash_register_llama_ops_keyed).
void register_llama_ops_keyed();

}  // namespace dflash
