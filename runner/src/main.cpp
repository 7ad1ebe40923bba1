// dflash_runner: DFlash (or plain) decoding over a directory of dflash-et programs, greedy or sampled.
//
//   dflash_runner --programs DIR (--prompt TEXT | --prompt-ids 1,2,3) [--ar | --lookup] [--block-size B|auto]
//                 [--max-new-tokens N] [--json] [--threads N] [--temperature T [--top-p P] [--top-k K]
//                 [--proposals argmax|sample] [--seed S]] [--cost-curve FILE]
//                 (--lookup: lookup proposals, lookup.h, in place of the draft's; a fixed block)
//   dflash_runner --programs DIR --prompt TEXT --tokenize   prints the prompt's ids and exits (loads no program)
//   dflash_runner --programs DIR --serve     one request per stdin line, one JSON reply per line:
//                                            "ar MAX_NEW IDS [SAMPLING]", "dflash BLOCK|auto MAX_NEW IDS [SAMPLING]" or
//                                            "lookup BLOCK MAX_NEW IDS [SAMPLING]"
//                                            (IDS: 1,2,3; SAMPLING: temperature=T top_p=P top_k=K proposals=P seed=S),
//                                            or "cost_curve REPEATS": auto's cost curve (measured once, unless given)
//   dflash_runner --programs DIR --worker [--ar | --block-size B|auto]   a model worker for ExecuTorch's llm_server
//                                            (`dflash serve`; worker.h): auto unless told otherwise
//
// auto's cost curve comes from --cost-curve (the bench's reports/cost_curve.json for these programs), or is
// measured when auto first needs it.
//
// --prompt: text in, text out, as `dflash generate` (text.h): the user's message through the target's chat format
// and tokenizer (packaged beside the programs), the reply's text streamed to stdout as tokens are accepted, the
// statistics on stderr. --prompt-ids: ids in, ids out. Problems the user can fix are one line on stderr and exit
// status 1 (2 for bad arguments).
#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <executorch/runtime/platform/platform.h>
#include <executorch/runtime/platform/runtime.h>
#include <nlohmann/json.hpp>

#include "decode.h"
#include "llama_ops.h"
#include "sampling.h"
#include "text.h"
#include "worker.h"

// The runtime's thread pool (libexecutorch_threadpool.so exports it; the wheel ships no threadpool.h).
namespace executorch::extension::threadpool {
class ThreadPool {
 public:
  bool _unsafe_reset_threadpool(uint32_t num_threads);
};
ThreadPool* get_threadpool();
}  // namespace executorch::extension::threadpool

namespace {

using dflash::Generation;
using dflash::Sampling;
using dflash::UserError;

struct Args {
  std::string programs;
  std::vector<int64_t> prompt;
  std::string message;  // --prompt
  std::string mode = "dflash";  // --ar: ar; --lookup: lookup
  bool text = false, tokenize = false, json = false, serve = false, worker = false;
  int64_t block = 0;  // 0: the largest block the draft was exported for; dflash::kAuto: auto
  std::string cost_curve;  // auto's, from this file (none: measured)
  int64_t max_new_tokens = 128;
  int64_t threads = 0;  // 0: the runtime's default, one per core
  Sampling sampling;
};

[[noreturn]] void usage(const std::string& why) {
  std::cerr << "error: " << why << "\nusage: dflash_runner --programs DIR ((--prompt TEXT | --prompt-ids 1,2,3) "
               "[--ar | --lookup] [--block-size B|auto] [--max-new-tokens N] [--json] [--threads N] [--temperature T] "
               "[--top-p P] [--top-k K] [--proposals argmax|sample] [--seed S] | --prompt TEXT --tokenize | --serve | "
               "--worker) "
               "[--cost-curve FILE]\n";
  std::exit(2);
}

int64_t number(const std::string& text, const std::string& what) {
  try {
    size_t used = 0;
    const long long value = std::stoll(text, &used);
    if (used == text.size()) return value;
  } catch (const std::exception&) {
  }
  throw UserError(what + " must be an integer, got '" + text + "'");
}

double real(const std::string& text, const std::string& what) {
  try {
    size_t used = 0;
    const double value = std::stod(text, &used);
    if (used == text.size()) return value;
  } catch (const std::exception&) {
  }
  throw UserError(what + " must be a number, got '" + text + "'");
}

// One sampling setting (`name` as the Python engine's Sampling field), checked as it checks them.
void set(Sampling& s, const std::string& name, const std::string& value) {
  if (name == "temperature") {
    s.temperature = real(value, name);
    if (!(s.temperature >= 0 && std::isfinite(s.temperature))) {
      throw UserError("temperature must be 0 (greedy) or a positive number, got " + value);
    }
  } else if (name == "top_p") {
    s.top_p = real(value, name);
    if (!(s.top_p > 0 && s.top_p <= 1)) throw UserError("top_p must be in (0, 1], got " + value + "; 1 turns top-p off");
  } else if (name == "top_k") {
    s.top_k = number(value, name);
    if (s.top_k < 0) throw UserError("top_k must be at least 1 (0: off), got " + value);
  } else if (name == "proposals") {
    if (value != "argmax" && value != "sample") throw UserError("proposals must be argmax or sample, got " + value);
    s.sample_proposals = value == "sample";
  } else if (name == "seed") {
    s.seed = static_cast<uint64_t>(number(value, name));
  } else {
    throw UserError("unknown sampling setting " + name);
  }
}

int64_t block_size(const std::string& text) {
  return text == "auto" ? dflash::kAuto : number(text, "the block size");
}

std::vector<int64_t> ids(const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) out.push_back(number(item, "each prompt id"));
  return out;
}

Args parse_args(int argc, char** argv) {
  Args args;
  int prompts = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(flag + " needs a value");
      return argv[++i];
    };
    if (flag == "--programs") args.programs = value();
    else if (flag == "--prompt-ids") args.prompt = ids(value()), ++prompts;
    else if (flag == "--prompt") args.message = value(), args.text = true, ++prompts;
    else if (flag == "--tokenize") args.tokenize = true;
    else if (flag == "--block-size") args.block = block_size(value());
    else if (flag == "--cost-curve") args.cost_curve = value();
    else if (flag == "--max-new-tokens") args.max_new_tokens = number(value(), "--max-new-tokens");
    else if (flag == "--threads") args.threads = number(value(), "--threads");
    else if (flag == "--temperature" || flag == "--top-p" || flag == "--top-k" || flag == "--proposals" ||
             flag == "--seed") {
      std::string name = flag.substr(2);
      std::replace(name.begin(), name.end(), '-', '_');
      set(args.sampling, name, value());
    }
    else if (flag == "--ar" || flag == "--lookup") args.mode = flag.substr(2);
    else if (flag == "--json") args.json = true;
    else if (flag == "--serve") args.serve = true;
    else if (flag == "--worker") args.worker = true;
    else usage("unknown argument " + flag);
  }
  if (args.programs.empty()) usage("--programs is required");
  if (prompts + args.serve + args.worker != 1) {
    usage("give --prompt or --prompt-ids, or --serve or --worker to read requests from stdin");
  }
  if (args.tokenize && !args.text) usage("--tokenize prints the ids of a --prompt");
  if (args.worker && args.mode == "lookup") usage("--worker decodes with the draft or plainly (--ar), not --lookup");
  if (args.threads < 0) usage("--threads must be at least 1 (0: one per core)");
  return args;
}

// Peak resident memory of this process. Linux: VmHWM, which starts afresh at exec (ru_maxrss would carry
// the peak of a parent that forked this process, such as a Python interpreter with torch loaded).
long peak_rss_kb() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stol(line.substr(6));
  }
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
#ifdef __APPLE__
  return usage.ru_maxrss / 1024;  // bytes there
#else
  return usage.ru_maxrss;
#endif
}

std::string to_json(const Generation& g, const std::string* text = nullptr) {
  std::ostringstream out;
  out.precision(9);
  out << "{\"tokens\": [";
  for (size_t i = 0; i < g.tokens.size(); ++i) out << (i ? ", " : "") << g.tokens[i];
  out << "], \"prefill_s\": " << g.prefill_s << ", \"rounds\": [";
  for (size_t i = 0; i < g.rounds.size(); ++i) {
    const auto& r = g.rounds[i];
    out << (i ? ", " : "") << "{\"verified\": " << r.verified << ", \"accepted\": " << r.accepted
        << ", \"emitted\": " << r.emitted << ", \"draft_s\": " << r.draft_s << ", \"verify_s\": " << r.verify_s
        << ", \"total_s\": " << r.total_s << ", \"drafted\": " << r.drafted << "}";
  }
  out << "], \"peak_rss_kb\": " << peak_rss_kb();
  if (text) out << ", \"text\": " << nlohmann::json(*text).dump();
  out << "}";
  return out.str();
}

std::string quoted(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += c == '\n' ? ' ' : c;
  }
  return out + "\"";
}

Generation run(dflash::Pair& pair, const std::string& mode, int64_t block, int64_t max_new_tokens,
               const std::vector<int64_t>& prompt, const Sampling& sampling,
               const dflash::OnTokens& on_tokens = nullptr) {
  dflash::Sampler sampler(sampling);
  if (mode == "ar") return pair.ar(prompt, max_new_tokens, sampler, on_tokens);
  if (block == dflash::kAuto && mode == "lookup") throw UserError("lookup proposals take a fixed block size, not auto");
  block = block ? block : pair.limits().max_block;
  if (mode == "lookup") return pair.lookup(prompt, max_new_tokens, block, sampler, on_tokens);
  return pair.dflash(prompt, max_new_tokens, block, sampler, on_tokens);
}

// --serve: the programs stay loaded (and their caches warm) across requests; a bad request gets an error reply.
void serve_engine(dflash::Pair& pair) {
  const auto& l = pair.limits();
  std::cout << "{\"max_context_len\": " << l.max_context_len << ", \"max_block_len\": " << l.max_block;
  if (const auto s = pair.recommended()) {
    std::cout << ", \"temperature\": " << s->temperature << ", \"top_p\": " << s->top_p << ", \"top_k\": " << s->top_k;
  }
  std::cout << ", \"peak_rss_kb\": " << peak_rss_kb() << "}" << std::endl;
  for (std::string line; std::getline(std::cin, line);) {
    std::istringstream in(line);
    std::string mode, prompt, block = "0";
    int64_t max_new = 0;
    try {
      in >> mode;
      if (mode == "cost_curve" && in >> max_new) {
        std::cout << pair.cost_curve(max_new).to_json() << std::endl;
        continue;
      }
      if (mode == "dflash" || mode == "lookup") in >> block;
      if (!(in >> max_new >> prompt) || (mode != "ar" && mode != "dflash" && mode != "lookup")) {
        throw UserError("bad request '" + line + "'; send 'ar MAX_NEW IDS', 'dflash BLOCK|auto MAX_NEW IDS' or "
                        "'lookup BLOCK MAX_NEW IDS', then any of temperature=T top_p=P top_k=K "
                        "proposals=argmax|sample seed=S; "
                        "or 'cost_curve REPEATS'");
      }
      Sampling sampling;
      for (std::string setting; in >> setting;) {
        const size_t eq = setting.find('=');
        if (eq == std::string::npos) throw UserError("bad sampling setting '" + setting + "'; write name=value");
        set(sampling, setting.substr(0, eq), setting.substr(eq + 1));
      }
      std::cout << to_json(run(pair, mode, block_size(block), max_new, ids(prompt), sampling)) << std::endl;
    } catch (const UserError& e) {
      std::cout << "{\"error\": " << quoted(e.what()) << "}" << std::endl;
    }
  }
}

// ExecuTorch logs at Info what no user acts on (the thread pool's five cpuinfo lines, every run): the runtime's
// own printer gets errors and fatal messages only (dflash_et/runtime/programs.py keeps the same rule).
pal_emit_log_message_method runtime_printer = nullptr;

void print_errors_only(et_timestamp_t timestamp, et_pal_log_level_t level, const char* filename,
                       const char* function, size_t line, const char* message, size_t length) {
  if (level != kDebug && level != kInfo) runtime_printer(timestamp, level, filename, function, line, message, length);
}

}  // namespace

int main(int argc, char** argv) {
  runtime_printer = executorch::runtime::get_pal_impl()->emit_log_message;
  executorch::runtime::register_pal(executorch::runtime::PalImpl::create(print_errors_only, __FILE__));
  executorch::runtime::runtime_init();
  dflash::register_llama_ops();
  try {
    const Args args = parse_args(argc, argv);
    std::unique_ptr<dflash::Text> text;  // before the programs load: a missing tokenizer fails at once
    std::vector<int64_t> prompt = args.prompt;
    if (args.text || args.worker) text = std::make_unique<dflash::Text>(args.programs);
    if (args.text) prompt = text->prompt(args.message);
    if (args.tokenize) {
      for (size_t i = 0; i < prompt.size(); ++i) std::cout << (i ? "," : "") << prompt[i];
      std::cout << std::endl;
      return 0;
    }
    if (args.threads) {  // before any program loads: XNNPACK takes the pool when a program is initialized
      executorch::extension::threadpool::get_threadpool()->_unsafe_reset_threadpool(args.threads);
    }
    dflash::Pair pair(args.programs);
    if (!args.cost_curve.empty()) pair.load_cost_curve(args.cost_curve);
    if (args.serve) {
      serve_engine(pair);
      return 0;
    }
    if (args.worker) {
      dflash::run_worker(pair, *text, args.mode == "ar", args.block ? args.block : dflash::kAuto);
      return 0;
    }
    std::unique_ptr<dflash::TextStream> stream;
    std::string reply;  // the whole text, for --json
    dflash::OnTokens on_tokens;
    if (text) {
      stream = std::make_unique<dflash::TextStream>(*text);
      on_tokens = [&](const std::vector<int64_t>& tokens) {
        const std::string more = stream->add(tokens);
        reply += more;
        if (!args.json) std::cout << more << std::flush;
        return true;
      };
    }
    const Generation g = run(pair, args.mode, args.block, args.max_new_tokens, prompt, args.sampling, on_tokens);
    const std::string rest = stream ? stream->finish() : "";
    if (args.json) {
      std::cout << to_json(g, text ? &(reply += rest) : nullptr) << std::endl;
    } else {
      if (text) {
        std::cout << rest;  // a character the last token left unfinished, as U+FFFD
      } else {
        for (size_t i = 0; i < g.tokens.size(); ++i) std::cout << (i ? "," : "") << g.tokens[i];
      }
      double decode_s = 0;
      for (const auto& r : g.rounds) decode_s += r.total_s;
      std::cout << std::endl;
      std::fprintf(stderr, "[%s] %zu tokens, %zu rounds, %.1f tokens/s\n", args.mode.c_str(), g.tokens.size(),
                   g.rounds.size(), decode_s > 0 ? (g.tokens.size() - 1) / decode_s : 0.0);
    }
  } catch (const std::exception& e) {  // UserError, or a program call that failed (the runtime logged why)
    std::cerr << "error: " << e.what() << std::endl;
    return 1;
  }
  return 0;
}
