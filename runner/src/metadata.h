// The programs' constant methods and methods, as dflash_et/metadata.py names them (tests/test_metadata.py
// holds the two to one list): ExecuTorch's LLM runner names with their meanings, plus upstream DFlash's.
#pragma once

namespace dflash::metadata {

inline constexpr const char* kTargetMethod = "target";  // target.pte: logits and taps (`forward`: logits alone)
inline constexpr const char* kDraftMethod = "draft";    // draft.pte, or target.pte itself (export.layout single)

inline constexpr const char* kMaxSeqLen = "get_max_seq_len";          // most tokens one target call takes
inline constexpr const char* kMaxContextLen = "get_max_context_len";  // the KV cache's length
inline constexpr const char* kVocabSize = "get_vocab_size";
inline constexpr const char* kEosIds = "get_eos_ids";
inline constexpr const char* kTargetLayerIds = "get_target_layer_ids";
inline constexpr const char* kCheckpointId = "get_checkpoint_id";
inline constexpr const char* kDraftCheckpointId = "get_draft_checkpoint_id";
inline constexpr const char* kTargetCheckpointId = "get_target_checkpoint_id";
inline constexpr const char* kMaskTokenId = "get_mask_token_id";
inline constexpr const char* kMaxBlockLen = "get_max_block_len";
inline constexpr const char* kContextWindow = "get_context_window";  // a windowed draft: taps it never reads
inline constexpr const char* kSelectorTopK = "get_selector_top_k";  // a DFlash2 draft: it returns a lattice
inline constexpr const char* kVocabIds = "get_vocab_ids";  // a reduced draft head: the token id of each logit
inline constexpr const char* kTemperature = "get_temperature";
inline constexpr const char* kTopP = "get_top_p";
inline constexpr const char* kTopK = "get_top_k";

}  // namespace dflash::metadata
