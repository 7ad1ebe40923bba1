// dflash_runner --worker: a model worker for ExecuTorch's OpenAI-compatible server (examples/llm_server), speaking
// the JSONL protocol its python/worker_client.py drives (protocol.h: what it shares with the --ids worker), with
// text, named sessions, cancellation and stop strings, and the programs loaded once:
//   (at start)                       -> the ready line, with "max_named_sessions": N, "supports_cancel": B
//   {"op": "open"|"close"|"reset", "session_id": S}  -> {"opened"|"closed"|"reset": true, "session_id": S}
//   {"prompt": TEXT | "prompt_segments": [{"text": T} | {"ids": [..]}, ..], "max_new_tokens": N (-1: to the
//    context's end), "temperature", "top_p", "top_k", "seed", "stop": [..], "session_id"?, "cancel_request_id"?}
//                                    -> {"token": TEXT} per round, then {"done": true, usage, finish_reason,
//                                       warm-resume accounting, timings, generated_token_ids, cancelled, dflash}
// TEXT is the rendered chat (the server applies the template), tokenized as `tok.encode(text,
// add_special_tokens=False)`; a reply's TEXT carries the special tokens it writes but the end of its turn (the
// server's content filter, stop strings and tool parser see a family's markers: Gemma 4's channels and calls,
// which it writes as special tokens). Cancellation: 8-byte little-endian request ids written to the descriptor
// named by EXECUTORCH_LLM_WORKER_CONTROL_FD, read between rounds. A request may also name its "mode", "block_size"
// and "proposals" (protocol.h; ExecuTorch's server never sends them).
//
// The caches are the conversation's: a request whose prompt starts with what the last generation left in them
// (its prompt and its reply) runs only the rest (Pair::keep_resident), whichever session sent it. The worker keeps
// max_named_sessions names and evicts the one idle longest for a new one, so no client is refused for capacity.
#pragma once

#include <cstdint>
#include <string>

#include "decode.h"
#include "text.h"

namespace dflash {

// Serves requests until stdin ends with `mode` (dflash::generate's: ar, dflash or lookup) at blocks of `block` (kAuto:
// auto), unless a request says otherwise.
void run_worker(Pair& pair, const Text& text, const std::string& mode, int64_t block);

}  // namespace dflash
