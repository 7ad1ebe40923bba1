// The worker protocol (`dflash_runner --worker`), what both workers share: requests read, checked and refused
// alike, and the --ids worker, ids in and out, which dflash-et's own engine drives (runtime/cpp_runner.py: the bench's
// C++ runner, `dflash generate --runner cpp`). `dflash serve`'s worker, with text, sessions, cancellation and stop
// strings, is worker/worker.h; the pipeline's stages do not depend on it (dvc.yaml).
//
// stdin, one JSON object per line; stdout, only protocol JSON, one object per line; logs on stderr:
//   (at start)                        -> {"ready": true, "max_context_len", "max_block", "peak_rss_kb", and the
//                                         checkpoint's recommended "temperature", "top_p", "top_k" where it has them}
//   {"prompt_segments": [{"ids": [..]}, ..], "max_new_tokens": N (-1 or none: to the context's end), "temperature",
//    "top_p", "top_k", "seed", "proposals": "argmax"|"sample", "mode": "ar"|"dflash"|"lookup", "block_size": N|"auto"}
//                                     -> {"ids": [..]} per round as it is accepted, then {"done": true} with the
//                                        generation's record (settings.h: every token, the prefill's and each
//                                        round's figures, the peak memory)
//   {"op": "cost_curve", "repeats": N} -> {"cost_curve": {...}}: auto's (the one given, or measured now, once)
//   anything wrong                    -> {"error": MESSAGE, "code": CODE}, and the worker reads the next line
// A request that names no mode or block takes the worker's (--ar, --lookup, --block-size); a seed is taken as given.
// Each request runs its prompt whole (the engine times prefills).
#pragma once

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "decode.h"
#include "text.h"

namespace dflash {

using json = nlohmann::json;

// One protocol line on stdout (invalid UTF-8 replaced, not thrown).
void send(const json& message);

// A request the worker refuses, with the protocol's error code.
struct RequestError : std::runtime_error {
  RequestError(const std::string& what, std::string code) : std::runtime_error(what), code(std::move(code)) {}
  std::string code;
};

// `request[name]` as a T; `otherwise` when it is absent or null, a RequestError when it has another type.
template <typename T>
T field(const json& request, const char* name, T otherwise) {
  if (!request.contains(name) || request[name].is_null()) return otherwise;
  try {
    return request[name].get<T>();
  } catch (const json::exception&) {
    throw RequestError(std::string("'") + name + "' has the wrong type: " + request[name].dump(), "invalid_request");
  }
}

// What a generate request decodes with: its mode and block (the worker's, `mode` and `block`, unless it names them)
// and its sampling settings, checked as the runner's flags are. Without `seed_as_given`, a seed of 0 (the
// OpenAI server's "none") or none at all is a new draw each request.
struct Decoding {
  std::string mode;
  int64_t block;
  Sampling sampling;
};
Decoding decoding(const json& request, const std::string& mode, int64_t block, bool seed_as_given);

// The prompt of a generate request: `prompt` (text) or `prompt_segments` of text and ids, in order. `text` null:
// ids only.
std::vector<int64_t> prompt_ids(const json& request, const Text* text);

// The ready line's fields: the limits, the checkpoint's recommended sampling, the peak memory once loaded.
json ready_fields(Pair& pair);

// Reads requests until stdin ends, passing each to `handle`: an `op` to `op` after cost_curve (answered here), a
// generation to `generate`. A refused request is an error line; a failed program call (the runtime logged why)
// forgets the caches (nothing cached is sure) and is `generation_failed`.
void serve_requests(Pair& pair, const std::function<void(const std::string&, const json&)>& op,
                    const std::function<void(const json&)>& generate);

// The --ids worker: serves the requests above until stdin ends.
void run_ids_worker(Pair& pair, const std::string& mode, int64_t block);

}  // namespace dflash
