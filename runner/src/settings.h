// A request's settings written as text, checked as the Python engine checks them, and a generation's record: the
// runner's flags and --json output, and the worker's fields and replies, read and write them alike.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "decode.h"

namespace dflash {

// An integer, or a UserError naming `what` and the text given.
int64_t number(const std::string& text, const std::string& what);
// A number, or a UserError naming `what` and the text given.
double real(const std::string& text, const std::string& what);
// One sampling setting (`name` as the Python engine's Sampling field: temperature, top_p, top_k, proposals, seed).
void set(Sampling& s, const std::string& name, const std::string& value);
// A block size: an integer, or "auto" (kAuto).
int64_t block_size(const std::string& text);
// Peak resident memory of this process, in KiB. Linux: VmHWM, which starts afresh at exec (ru_maxrss would carry
// the peak of a parent that forked this process, such as a Python interpreter with torch loaded).
long peak_rss_kb();
// A generation as dflash-et's engine reads it (runtime/cpp_runner.py's Generation): every token, the prefill's
// seconds, each round's counts and seconds, and the process's peak memory.
nlohmann::json record(const Generation& g);

}  // namespace dflash
