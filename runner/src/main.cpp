// dflash_runner: DFlash (or plain) decoding over a directory of dflash-et programs, greedy or sampled.
//
//   dflash_runner --programs DIR (--prompt TEXT | --prompt-ids 1,2,3) [--ar | --lookup] [--block-size B|auto]
//                 [--max-new-tokens N] [--json] [--threads N] [--temperature T [--top-p P] [--top-k K]
//                 [--proposals argmax|sample] [--seed S]] [--cost-curve FILE]
//                 (--lookup: lookup proposals, lookup.h, in place of the draft's; auto: those that pay)
//   dflash_runner --programs DIR --prompt TEXT --tokenize   prints the prompt's ids and exits (loads no program)
//   dflash_runner --programs DIR --worker [--ar | --lookup] [--block-size B|auto] [--ids]
//                 a model worker for ExecuTorch's llm_server (`dflash serve`; worker.h): auto unless told otherwise;
//                 --ids: ids in and out, no tokenizer (protocol.h: dflash-et's engine)
//
// auto's cost curve comes from --cost-curve (the bench's reports/cost_curve.json for these programs), or is
// measured when auto first needs it.
//
// --prompt: text in, text out, as `dflash generate` (text.h): the user's message through the target's chat format
// and tokenizer (packaged beside the programs), the reply's text streamed to stdout as tokens are accepted, the
// statistics on stderr. --prompt-ids: ids in, ids out. Problems the user can fix are one line on stderr and exit
// status 1 (2 for bad arguments).
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <executorch/runtime/platform/platform.h>
#include <executorch/runtime/platform/runtime.h>

#include "decode.h"
#include "llama_ops.h"
#include "protocol.h"
#include "settings.h"
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
using dflash::number;
using dflash::Sampling;
using dflash::UserError;

struct Args {
  std::string programs;
  std::vector<int64_t> prompt;
  std::string message;  // --prompt
  std::string mode = "dflash";  // --ar: ar; --lookup: lookup
  bool text = false, tokenize = false, json = false, worker = false, ids = false;
  int64_t block = 0;  // 0: the largest block the draft was exported for; dflash::kAuto: auto
  std::string cost_curve;  // auto's, from this file (none: measured)
  int64_t max_new_tokens = 128;
  int64_t threads = 0;  // 0: the runtime's default, one per core
  Sampling sampling;
};

[[noreturn]] void usage(const std::string& why) {
  std::cerr << "error: " << why << "\nusage: dflash_runner --programs DIR ((--prompt TEXT | --prompt-ids 1,2,3) "
               "[--ar | --lookup] [--block-size B|auto] [--max-new-tokens N] [--json] [--threads N] [--temperature T] "
               "[--top-p P] [--top-k K] [--proposals argmax|sample] [--seed S] | --prompt TEXT --tokenize | "
               "--worker [--ar | --lookup] [--block-size B|auto] [--ids]) "
               "[--cost-curve FILE]\n";
  std::exit(2);
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
    else if (flag == "--block-size") args.block = dflash::block_size(value());
    else if (flag == "--cost-curve") args.cost_curve = value();
    else if (flag == "--max-new-tokens") args.max_new_tokens = number(value(), "--max-new-tokens");
    else if (flag == "--threads") args.threads = number(value(), "--threads");
    else if (flag == "--temperature" || flag == "--top-p" || flag == "--top-k" || flag == "--proposals" ||
             flag == "--seed") {
      std::string name = flag.substr(2);
      std::replace(name.begin(), name.end(), '-', '_');
      dflash::set(args.sampling, name, value());
    }
    else if (flag == "--ar" || flag == "--lookup") args.mode = flag.substr(2);
    else if (flag == "--json") args.json = true;
    else if (flag == "--worker") args.worker = true;
    else if (flag == "--ids") args.ids = true;
    else usage("unknown argument " + flag);
  }
  if (args.programs.empty()) usage("--programs is required");
  if (prompts + args.worker != 1) usage("give --prompt or --prompt-ids, or --worker to read requests from stdin");
  if (args.ids && !args.worker) usage("--ids is a worker's (--worker --ids)");
  if (args.tokenize && !args.text) usage("--tokenize prints the ids of a --prompt");
  if (args.threads < 0) usage("--threads must be at least 1 (0: one per core)");
  return args;
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
    if (args.text || (args.worker && !args.ids)) text = std::make_unique<dflash::Text>(args.programs);
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
    if (args.worker) {
      const int64_t block = args.block ? args.block : dflash::kAuto;
      if (text) {
        dflash::run_worker(pair, *text, args.mode, block);
      } else {
        dflash::run_ids_worker(pair, args.mode, block);
      }
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
    dflash::Sampler sampler(args.sampling);
    const Generation g = dflash::generate(pair, args.mode, args.block, args.max_new_tokens, prompt, sampler, on_tokens);
    const std::string rest = stream ? stream->finish() : "";
    if (args.json) {
      nlohmann::json out = dflash::record(g);
      if (text) out["text"] = reply + rest;
      std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << std::endl;
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
