/*!
 * \file tvm_hetero/llm/chunk_plan.h
 * \brief Chunked prefill: which static graph (chunk size) processes which rows of a prompt -- the
 *        algorithm of python/tvm_hetero/llm/buckets.py, with the same guarantee and the same plans.
 *
 * Guarantee: for any length >= 1 and a non-empty set of chunk sizes, the chunks' real rows add up to
 * exactly the length, each chunk's real rows lie in [1, its size], and of all such sequences the plan
 * has the least cost `rows computed (padding included) + call_cost x calls` (dynamic programming over
 * the remaining length; ties go to fewer calls, then to larger chunks first). Only the last chunk is
 * padded: padding in an earlier chunk would leave a gap in the cache.
 */
#ifndef TVM_HETERO_LLM_CHUNK_PLAN_H_
#define TVM_HETERO_LLM_CHUNK_PLAN_H_

#include <cstdint>
#include <vector>

namespace tvm_hetero {
namespace llm {

/*! \brief What one graph call costs, counted in rows (buckets.py's DEFAULT_CALL_COST). */
inline constexpr int64_t kDefaultCallCost = 8;

/*! \brief One call of a prefill: the graph's chunk size and the prompt rows it carries. */
struct Chunk {
  /*! \brief Rows of the graph called. */
  int64_t size = 0;
  /*! \brief Real (prompt) rows in it, 1..size; the rest is padding. */
  int64_t rows = 0;
  bool operator==(const Chunk& other) const { return size == other.size && rows == other.rows; }
};

/*!
 * \brief The plans of every length up to a maximum, solved once: a prompt's chunks are then read off
 *        a table (no allocation per prompt).
 */
class ChunkPlanner {
 public:
  /*! \brief Solve every length 1..max_length over `sizes` (positive, at least one). */
  ChunkPlanner(std::vector<int64_t> sizes, int64_t max_length, int64_t call_cost = kDefaultCallCost);
  /*! \brief The first chunk covering `remaining` rows (1..max_length); the next starts after its rows. */
  Chunk First(int64_t remaining) const;
  /*! \brief The whole plan of `length` rows. */
  std::vector<Chunk> Plan(int64_t length) const;
  int64_t max_length() const { return static_cast<int64_t>(first_size_.size()) - 1; }

 private:
  /*! \brief Per remaining length: the size of the first chunk of its best plan (index 0 unused). */
  std::vector<int64_t> first_size_;
};

/*! \brief The plan of `length` rows over `sizes` (buckets.plan_chunks). */
std::vector<Chunk> PlanChunks(int64_t length, const std::vector<int64_t>& sizes,
                              int64_t call_cost = kDefaultCallCost);

}  // namespace llm
}  // namespace tvm_hetero

#endif  // TVM_HETERO_LLM_CHUNK_PLAN_H_
