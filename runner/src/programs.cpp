#include "programs.h"

#include <sys/stat.h>

#include <executorch/runtime/core/error.h>

#include "rebuild.h"

namespace dflash {
namespace {

using executorch::extension::MmapDataLoader;
using executorch::runtime::Error;
using executorch::runtime::EValue;

std::string name_of(Error e) { return executorch::runtime::to_string(e); }

std::shared_ptr<MmapDataLoader> open(const std::string& path, const std::string& why_needed) {
  if (!is_file(path)) throw UserError(path + " is missing" + why_needed + ": " + kRebuild);
  auto loader = MmapDataLoader::from(path.c_str(), MmapDataLoader::MlockConfig::NoMlock);
  if (!loader.ok()) {
    throw UserError(path + " cannot be read (" + name_of(loader.error()) + "); check its permissions");
  }
  return std::make_shared<MmapDataLoader>(std::move(loader.get()));
}

}  // namespace

bool is_file(const std::string& path) {
  struct stat info {};
  return stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode);
}

SharedWeights::SharedWeights(const std::string& path) {
  loader_ = open(path, " (the programs keep their weights there: export.shared_weights)");
  auto map = executorch::extension::FlatTensorDataMap::load(loader_.get());
  if (!map.ok()) {
    throw UserError(path + " is not a readable weights file (" + name_of(map.error()) +
                    "): truncated or corrupt; " + kRebuild);
  }
  map_ = std::make_unique<executorch::extension::FlatTensorDataMap>(std::move(map.get()));
}

Pte::Pte(const std::string& path, const char* method_name, const SharedWeights* weights) : path_(path) {
  loader_ = open(path, "");
  auto program = executorch::runtime::Program::load(loader_.get(), executorch::runtime::Program::Verification::Minimal);
  if (!program.ok()) {
    throw UserError(path + " is not a readable ExecuTorch program (" + name_of(program.error()) +
                    "): truncated or corrupt; " + kRebuild);
  }
  program_ = std::make_shared<executorch::runtime::Program>(std::move(program.get()));
  load_method(method_name, weights, nullptr);
}

Pte::Pte(const Pte& sibling, const char* method_name, const SharedWeights* weights)
    : path_(sibling.path_), loader_(sibling.loader_), program_(sibling.program_) {
  load_method(method_name, weights, sibling.arena_.buffers.empty() ? nullptr : sibling.arena_.buffers.back());
}

void Pte::load_method(const char* method_name, const SharedWeights* weights,
                      std::shared_ptr<std::vector<uint8_t>> state) {
  if (!program_->method_meta(method_name).ok()) {
    throw UserError(path_ + " has no " + method_name + " method: it was exported by another tool or an older "
                    "dflash-et; re-export it (dvc repro)");
  }
  auto method = load(method_name, arena_, weights, std::move(state));
  if (!method.ok()) {
    std::string why = name_of(method.error());
    if (method.error() == Error::OperatorMissing) {
      throw UserError(path_ + " calls an operator dflash_runner lacks (" + why + ", named in the log line above)");
    }
    throw UserError(path_ + " cannot be loaded (" + why + ")" +
                    (weights ? std::string("; is shared.ptd from the same export?")
                             : std::string("; if it keeps its weights in a .ptd (export.shared_weights), "
                                           "shared.ptd must be beside it")));
  }
  method_ = std::make_unique<executorch::runtime::Method>(std::move(method.get()));
}

executorch::runtime::Result<executorch::runtime::Method> Pte::load(const char* name, Arena& arena,
                                                                    const SharedWeights* weights,
                                                                    std::shared_ptr<std::vector<uint8_t>> state) const {
  auto meta = program_->method_meta(name);
  if (!meta.ok()) return meta.error();
  const size_t n = meta->num_memory_planned_buffers();
  for (size_t i = 0; i < n; ++i) {
    const size_t size = meta->memory_planned_buffer_size(i).get();
    const bool shared = state && i == n - 1 && n > 1 && state->size() == size;  // the one state arena
    arena.buffers.push_back(shared ? state : std::make_shared<std::vector<uint8_t>>(size));
    arena.spans.emplace_back(arena.buffers.back()->data(), arena.buffers.back()->size());
  }
  arena.planned = std::make_unique<executorch::runtime::HierarchicalAllocator>(
      executorch::runtime::Span<executorch::runtime::Span<uint8_t>>(arena.spans.data(), arena.spans.size()));
  arena.memory = std::make_unique<executorch::runtime::MemoryManager>(&arena.method_allocator, arena.planned.get(),
                                                                       &arena.temp_allocator);
  return program_->load_method(name, arena.memory.get(), nullptr, weights ? weights->map() : nullptr);
}

std::vector<EValue> Pte::constant(const std::string& method_name) const {
  auto meta = program_->method_meta(method_name.c_str());
  if (!meta.ok()) {
    throw UserError(path_ + " lacks " + method_name + "; it was exported by another tool or an older dflash-et: "
                    "re-export it (dvc repro)");
  }
  Arena arena;
  auto method = load(method_name.c_str(), arena, nullptr);
  if (!method.ok() || method->execute() != Error::Ok) {
    throw UserError(path_ + ": " + method_name + " cannot be run; re-export the program (dvc repro)");
  }
  std::vector<EValue> values(method->outputs_size());
  for (size_t i = 0; i < values.size(); ++i) values[i] = method->get_output(i);
  return values;
}

// By name, not method_meta: that logs an error line for a method the program lacks (optional metadata often is)
bool Pte::has(const std::string& name) const {
  for (size_t i = 0; i < program_->num_methods(); ++i) {
    if (auto method = program_->get_method_name(i); method.ok() && name == method.get()) return true;
  }
  return false;
}

double Pte::real(const std::string& name) const {
  auto values = constant(name);
  if (values.size() != 1 || !values[0].isDouble()) throw UserError(path_ + ": " + name + " is not one number");
  return values[0].toDouble();
}

int64_t Pte::integer(const std::string& name) const {
  auto values = constant(name);
  if (values.size() != 1 || !values[0].isInt()) throw UserError(path_ + ": " + name + " is not one integer");
  return values[0].toInt();
}

std::vector<int64_t> Pte::integers(const std::string& name) const {
  std::vector<int64_t> out;
  for (const auto& v : constant(name)) {
    if (!v.isInt()) throw UserError(path_ + ": " + name + " is not a list of integers");
    out.push_back(v.toInt());
  }
  return out;
}

void Pte::call(const std::vector<EValue>& inputs) {
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Error e = method_->set_input(inputs[i], i);
    if (e != Error::Ok) throw std::runtime_error(path_ + ": input " + std::to_string(i) + " rejected (" + name_of(e) + ")");
  }
  const Error e = method_->execute();
  if (e != Error::Ok) throw std::runtime_error(path_ + ": its method failed (" + name_of(e) + ")");
}

}  // namespace dflash
