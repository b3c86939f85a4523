/*!
 * \file llm/chunk_plan.cc
 * \brief The chunked-prefill plan (tvm_hetero/llm/chunk_plan.h): buckets.py's dynamic program.
 */
#include <tvm/ffi/error.h>
#include <tvm_hetero/llm/chunk_plan.h>

#include <algorithm>
#include <tuple>

namespace tvm_hetero {
namespace llm {

ChunkPlanner::ChunkPlanner(std::vector<int64_t> sizes, int64_t max_length, int64_t call_cost) {
  if (sizes.empty()) TVM_FFI_THROW(ValueError) << "chunk plan: at least one chunk size is needed";
  for (int64_t size : sizes) {
    if (size < 1) TVM_FFI_THROW(ValueError) << "chunk plan: chunk size " << size << " is not positive";
  }
  if (max_length < 1) TVM_FFI_THROW(ValueError) << "chunk plan: length must be at least 1, got " << max_length;
  std::sort(sizes.begin(), sizes.end(), std::greater<int64_t>());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  // Per remaining length: (cost, calls, -first size), compared as a tuple like buckets.py's min().
  std::vector<std::tuple<int64_t, int64_t, int64_t>> best(max_length + 1, {0, 0, 0});
  first_size_.assign(max_length + 1, 0);
  for (int64_t remaining = 1; remaining <= max_length; ++remaining) {
    std::tuple<int64_t, int64_t, int64_t> choice{0, 0, 0};
    bool any = false;
    for (int64_t size : sizes) {
      std::tuple<int64_t, int64_t, int64_t> option;
      if (size >= remaining) {  // the last chunk: padded up to its size
        option = {size + call_cost, 1, -size};
      } else {
        const auto& [cost, calls, first] = best[remaining - size];
        option = {cost + size + call_cost, calls + 1, -size};
      }
      if (!any || option < choice) choice = option;
      any = true;
    }
    best[remaining] = choice;
    first_size_[remaining] = -std::get<2>(choice);
  }
}

Chunk ChunkPlanner::First(int64_t remaining) const {
  if (remaining < 1 || remaining > max_length()) {
    TVM_FFI_THROW(ValueError) << "chunk plan: " << remaining << " rows are outside the planned 1.." << max_length();
  }
  int64_t size = first_size_[remaining];
  return Chunk{size, std::min(size, remaining)};
}

std::vector<Chunk> ChunkPlanner::Plan(int64_t length) const {
  std::vector<Chunk> chunks;
  for (int64_t remaining = length; remaining > 0;) {
    Chunk chunk = First(remaining);
    chunks.push_back(chunk);
    remaining -= chunk.rows;
  }
  return chunks;
}

std::vector<Chunk> PlanChunks(int64_t length, const std::vector<int64_t>& sizes, int64_t call_cost) {
  return ChunkPlanner(sizes, length, call_cost).Plan(length);
}

}  // namespace llm
}  // namespace tvm_hetero
