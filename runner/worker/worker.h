// dflash_runner --worker: a model worker for ExecuTorch's OpenAI-compatible server (examples/llm_server), speaking
// the JSONL protocol its python/worker_client.py drives, with the programs loaded once.
//
// stdin, one JSON object per line; stdout, only protocol JSON, one object per line; logs on stderr:
//   (at start)                       -> {"ready": true, "max_named_sessions": N, "supports_cancel": B, ...}
//   {"op": "open"|"close"|"reset", "session_id": S}  -> {"opened"|"closed"|"reset": true, "session_id": S}
//   {"prompt": TEXT | "prompt_segments": [{"text": T} | {"ids": [..]}, ..], "max_new_tokens": N (-1: to the
//    context's end), "temperature", "top_p", "top_k", "seed", "stop": [..], "session_id"?, "cancel_request_id"?}
//                                    -> {"token": TEXT} per step, then {"done": true, usage, finish_reason,
//                                       warm-resume accounting, timings, generated_token_ids, cancelled, dflash}
//   {"op": "cost_curve", "repeats": N}  -> {"cost_curve": {...}}: auto's (the one given, or measured now, once)
//   anything wrong                   -> {"error": MESSAGE, "code": CODE}, and the worker reads the next line
// TEXT is the rendered chat (the server applies the template), tokenized as `tok.encode(text,
// add_special_tokens=False)`; a reply's TEXT carries the special tokens it writes but the end of its turn (the
// server's content filter, stop strings and tool parser see a family's markers: Gemma 4's channels and calls,
// which it writes as special tokens). Cancellation: 8-byte little-endian request ids written to the descriptor
// named by EXECUTORCH_LLM_WORKER_CONTROL_FD, read between decoding steps.
//
// The caches are the conversation's: a request whose prompt starts with what the last generation left in them
// (its prompt and its reply) runs only the rest (Pair::keep_resident), whichever session sent it. The worker keeps
// max_named_sessions names and evicts the one idle longest for a new one, so no client is refused for capacity.
//
// A generate request may also name its decoding (beyond what ExecuTorch's server sends): "mode" ("ar", "dflash" or
// "lookup"; the worker's own by default), "block_size" (a number, or "auto") and "proposals" ("argmax"|"sample").
// The ready line carries the limits, the checkpoint's recommended sampling and the peak memory once loaded.
//
// --ids (what dflash-et's own engine runs, runtime/cpp_runner.py): no tokenizer; prompts are prompt_segments of ids;
// each round's accepted ids stream as {"ids": [..]}; the done line carries the generation's record (settings.h:
// every token, the prefill's and each round's figures); a seed is taken as given (the server's 0 means none); each
// request runs its prompt whole (the engine times prefills), and no stop strings (no text).
#pragma once

#include <cstdint>

#include "decode.h"
#include "text.h"

namespace dflash {

// Serves requests until stdin ends: plain decoding (`ar`), or DFlash with blocks of `block` (kAuto: auto), unless a
// request says otherwise. `text` null: --ids.
void run_worker(Pair& pair, const Text* text, bool ar, int64_t block);

}  // namespace dflash
