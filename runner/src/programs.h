// Loading the programs (target.pte and draft.pte, or target.pte alone holding both; shared.ptd, once, for
// both) and calling their methods.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <executorch/extension/data_loader/mmap_data_loader.h>
#include <executorch/extension/flat_tensor/flat_tensor_data_map.h>
#include <executorch/extension/memory_allocator/malloc_memory_allocator.h>
#include <executorch/runtime/executor/program.h>

#include "errors.h"

namespace dflash {

bool is_file(const std::string& path);

// shared.ptd: the weights both programs read, loaded once and handed to both.
class SharedWeights {
 public:
  explicit SharedWeights(const std::string& path);
  const executorch::runtime::NamedDataMap* map() const { return &*map_; }

 private:
  std::shared_ptr<executorch::extension::MmapDataLoader> loader_;  // outlives map_
  std::unique_ptr<executorch::extension::FlatTensorDataMap> map_;
};

// One program: the method a DFlash runner calls, ready to execute, and its constant methods (metadata.h).
class Pte {
 public:
  Pte(const std::string& path, const char* method_name, const SharedWeights* weights);
  // Another method of `sibling`'s program (export.layout single): the file is mapped once, and the methods'
  // shared-state arena (MemoryPlanningPass(share_mutable_buffers) plans it last in every method, each state
  // buffer at its own offset) is one allocation, as in ExecuTorch's own runtimes.
  Pte(const Pte& sibling, const char* method_name, const SharedWeights* weights);
  Pte(const Pte&) = delete;
  Pte& operator=(const Pte&) = delete;

  // A constant method's values (one per list element); `name` is the method's (metadata.h).
  std::vector<executorch::runtime::EValue> constant(const std::string& name) const;
  bool has(const std::string& name) const;
  int64_t integer(const std::string& name) const;
  double real(const std::string& name) const;
  std::vector<int64_t> integers(const std::string& name) const;

  // Runs the method on `inputs`; output(i) then stays valid until the next call.
  void call(const std::vector<executorch::runtime::EValue>& inputs);
  const executorch::aten::Tensor& output(size_t i) const { return method_->get_output(i).toTensor(); }
  const std::string& path() const { return path_; }

  // What one loaded method owns: its allocators and planned memory (activations, and the KV caches that
  // persist from one call to the next).
  struct Arena {
    executorch::extension::MallocMemoryAllocator method_allocator, temp_allocator;
    std::vector<std::shared_ptr<std::vector<uint8_t>>> buffers;
    std::vector<executorch::runtime::Span<uint8_t>> spans;
    std::unique_ptr<executorch::runtime::HierarchicalAllocator> planned;
    std::unique_ptr<executorch::runtime::MemoryManager> memory;
  };

 private:
  // `state`: the shared-state arena of another method of this program, to use instead of a new one.
  executorch::runtime::Result<executorch::runtime::Method> load(
      const char* method, Arena& arena, const SharedWeights* weights,
      std::shared_ptr<std::vector<uint8_t>> state = nullptr) const;
  void load_method(const char* method_name, const SharedWeights* weights, std::shared_ptr<std::vector<uint8_t>> state);

  std::string path_;
  std::shared_ptr<executorch::extension::MmapDataLoader> loader_;  // outlives program_
  std::shared_ptr<executorch::runtime::Program> program_;
  Arena arena_;
  std::unique_ptr<executorch::runtime::Method> method_;
};

}  // namespace dflash
