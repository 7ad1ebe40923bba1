#include "protocol.h"

#include <iostream>
#include <random>

#include "settings.h"

namespace dflash {

void send(const json& message) {
  std::cout << message.dump(-1, ' ', false, json::error_handler_t::replace) << std::endl;
}

Decoding decoding(const json& request, const std::string& mode, int64_t block, bool seed_as_given) {
  Decoding d{field<std::string>(request, "mode", mode), block, {}};
  for (const char* name : {"temperature", "top_p", "top_k", "proposals"}) {
    if (request.contains(name) && !request[name].is_null()) {
      set(d.sampling, name, request[name].is_string() ? request[name].get<std::string>() : request[name].dump());
    }
  }
  d.sampling.seed = field<uint64_t>(request, "seed", 0);
  if (d.sampling.seed == 0 && !(seed_as_given && request.contains("seed"))) d.sampling.seed = std::random_device{}();
  if (request.contains("block_size") && !request["block_size"].is_null()) {
    const json& given = request["block_size"];
    d.block = given.is_string() ? block_size(given.get<std::string>()) : field<int64_t>(request, "block_size", 0);
  }
  return d;
}

std::vector<int64_t> prompt_ids(const json& request, const Text* text) {
  const auto encode = [&](const std::string& piece) {
    if (!text) {
      throw RequestError("this worker reads ids (--ids); send prompt_segments [{\"ids\": [...]}]", "invalid_request");
    }
    return text->encode(piece);
  };
  if (!request.contains("prompt_segments")) {
    if (!request.contains("prompt") || !request["prompt"].is_string()) {
      throw RequestError("a generate request needs a prompt (text) or prompt_segments", "invalid_request");
    }
    return encode(request["prompt"].get<std::string>());
  }
  const json& segments = request["prompt_segments"];
  if (!segments.is_array() || segments.empty()) {
    throw RequestError("prompt_segments must be a non-empty list", "invalid_request");
  }
  std::vector<int64_t> ids;
  for (const json& segment : segments) {
    std::vector<int64_t> more;
    if (segment.is_object() && segment.contains("text") && segment["text"].is_string()) {
      more = encode(segment["text"].get<std::string>());
    } else if (segment.is_object() && segment.contains("ids") && segment["ids"].is_array()) {
      more = field<std::vector<int64_t>>(segment, "ids", {});
    } else {
      throw RequestError("each prompt segment is {\"text\": ...} or {\"ids\": [...]}, got " + segment.dump(),
                         "invalid_request");
    }
    ids.insert(ids.end(), more.begin(), more.end());
  }
  return ids;
}

json ready_fields(Pair& pair) {
  const Limits& l = pair.limits();
  json ready = {{"ready", true}, {"max_context_len", l.max_context_len}, {"max_block", l.max_block},
                {"peak_rss_kb", peak_rss_kb()}};
  if (const auto s = pair.recommended()) {
    ready.update({{"temperature", s->temperature}, {"top_p", s->top_p}, {"top_k", s->top_k}});
  }
  return ready;
}

void serve_requests(Pair& pair, const std::function<void(const std::string&, const json&)>& op,
                    const std::function<void(const json&)>& generate) {
  for (std::string line; std::getline(std::cin, line);) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      json request;
      try {
        request = json::parse(line);
      } catch (const json::exception& e) {
        throw RequestError(std::string("the request is not JSON (") + e.what() + ")", "invalid_request");
      }
      if (!request.is_object()) throw RequestError("the request is not a JSON object", "invalid_request");
      const std::string name = field<std::string>(request, "op", "");
      if (name == "cost_curve") {
        send({{"cost_curve", json::parse(pair.cost_curve(field<int64_t>(request, "repeats", 5)).to_json())}});
      } else if (request.contains("op")) {
        op(name, request);
      } else {
        generate(request);
      }
    } catch (const RequestError& e) {
      send({{"error", e.what()}, {"code", e.code}});
    } catch (const UserError& e) {
      send({{"error", e.what()}, {"code", "invalid_request"}});
    } catch (const std::exception& e) {
      pair.forget();
      send({{"error", std::string("generation failed: ") + e.what()}, {"code", "generation_failed"}});
    }
  }
}

void run_ids_worker(Pair& pair, const std::string& mode, int64_t block) {
  send(ready_fields(pair));
  const auto op = [](const std::string& name, const json&) {
    throw RequestError("unknown op '" + name + "'; this worker (--ids) answers cost_curve (sessions are the text "
                       "worker's: --worker without --ids)", "invalid_request");
  };
  const auto generate = [&](const json& request) {
    const std::vector<int64_t> ids = prompt_ids(request, nullptr);
    if (ids.empty()) throw RequestError("the prompt is empty", "invalid_request");
    if (!field<std::vector<std::string>>(request, "stop", {}).empty()) {
      throw RequestError("stop strings need text; this worker reads ids (--ids)", "invalid_request");
    }
    const int64_t asked = field<int64_t>(request, "max_new_tokens", -1);
    const int64_t max_new = asked == -1 ? pair.limits().reply_room(static_cast<int64_t>(ids.size())) : asked;
    Decoding d = decoding(request, mode, block, /*seed_as_given=*/true);
    Sampler sampler(d.sampling);
    const OnTokens stream = [](const std::vector<int64_t>& tokens) {
      send({{"ids", tokens}});
      return true;
    };
    json done = record(dflash::generate(pair, d.mode, d.block, max_new, ids, sampler, stream));
    done["done"] = true;
    send(done);
  };
  serve_requests(pair, op, generate);
}

}  // namespace dflash
