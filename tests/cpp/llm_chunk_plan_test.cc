/*!
 * \file llm_chunk_plan_test.cc
 * \brief The pieces of the C++ generation loop that need no model: the chunk plan against brute
 *        force, the sampler's rules, SHA-256 and the Python-compatible JSON of the manifest checksum.
 */
#include <gtest/gtest.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/json.h>
#include <tvm_hetero/llm/chunk_plan.h>
#include <tvm_hetero/llm/sampler.h>

#include <functional>
#include <limits>
#include <vector>

#include "llm/python_json.h"
#include "llm/sha256.h"

namespace tvm_hetero {
namespace llm {
namespace {

/*! \brief The least cost of any valid plan of `length` rows, by exhaustive search (exponential). */
int64_t BruteForceCost(int64_t length, const std::vector<int64_t>& sizes) {
  if (length == 0) return 0;
  int64_t best = std::numeric_limits<int64_t>::max();
  for (int64_t size : sizes) {
    int64_t cost = size >= length ? size + kDefaultCallCost
                                  : size + kDefaultCallCost + BruteForceCost(length - size, sizes);
    best = std::min(best, cost);
  }
  return best;
}

TEST(LlmChunkPlan, CoversEveryLengthExactlyAtTheLeastCost) {
  for (const std::vector<int64_t>& sizes : std::vector<std::vector<int64_t>>{{1, 8, 32}, {1, 3, 5}, {1}, {1, 16, 64}}) {
    ChunkPlanner planner(sizes, 60);
    for (int64_t length = 1; length <= 60; ++length) {
      std::vector<Chunk> plan = planner.Plan(length);
      int64_t rows = 0, cost = 0;
      for (size_t i = 0; i < plan.size(); ++i) {
        EXPECT_GE(plan[i].rows, 1);
        EXPECT_LE(plan[i].rows, plan[i].size);
        if (i + 1 < plan.size()) EXPECT_EQ(plan[i].rows, plan[i].size) << "only the last chunk may be padded";
        rows += plan[i].rows;
        cost += plan[i].size + kDefaultCallCost;
      }
      EXPECT_EQ(rows, length);
      if (length <= 24) EXPECT_EQ(cost, BruteForceCost(length, sizes)) << "length " << length;  // exponential
      EXPECT_EQ(plan, PlanChunks(length, sizes));
    }
  }
}

TEST(LlmChunkPlan, DocumentedExamples) {
  EXPECT_EQ(PlanChunks(20, {1, 16, 64, 256}), (std::vector<Chunk>{{16, 16}, {16, 4}}));
  EXPECT_EQ(PlanChunks(300, {1, 16, 64, 256}), (std::vector<Chunk>{{256, 256}, {64, 44}}));
}

TEST(LlmSampler, GreedyTakesTheLowestIndexAmongEqualMaxima) {
  std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f};
  Sampler sampler(4);
  sampler.Reset(SamplingOptions());
  EXPECT_EQ(sampler.Choose(logits.data()), 1);
}

TEST(LlmSampler, SameSeedSameTokensAndTopKOneIsGreedy) {
  std::vector<float> logits(50);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = static_cast<float>((i * 37) % 11) * 0.3f;
  auto draw = [&](SamplingOptions options) {
    Sampler sampler(50);
    sampler.Reset(options);
    std::vector<int32_t> tokens;
    for (int i = 0; i < 40; ++i) tokens.push_back(sampler.Choose(logits.data()));
    return tokens;
  };
  SamplingOptions hot;
  hot.temperature = 2.0;
  hot.seed = 7;
  EXPECT_EQ(draw(hot), draw(hot));
  SamplingOptions other = hot;
  other.seed = 8;
  EXPECT_NE(draw(hot), draw(other));
  SamplingOptions top1 = hot;
  top1.top_k = 1;
  EXPECT_EQ(draw(top1), std::vector<int32_t>(40, Sampler::Argmax(logits.data(), 50)));
  SamplingOptions top3 = hot;
  top3.top_k = 3;
  for (int32_t token : draw(top3)) EXPECT_EQ((token * 37) % 11, 10) << "only the three most likely (all 3.0)";
  SamplingOptions nucleus = hot;
  nucleus.top_p = 1e-6;  // the most likely token alone reaches it
  EXPECT_EQ(draw(nucleus), std::vector<int32_t>(40, Sampler::Argmax(logits.data(), 50)));
}

TEST(LlmSampler, BadOptionsAreErrorsNamingTheOption) {
  Sampler sampler(4);
  SamplingOptions options;
  options.temperature = -1;
  EXPECT_THROW({
    try { sampler.Reset(options); } catch (const tvm::ffi::Error& e) {
      EXPECT_NE(std::string(e.what()).find("temperature"), std::string::npos);
      throw;
    }
  }, tvm::ffi::Error);
  options = SamplingOptions();
  options.top_k = 2;  // greedy with top_k
  EXPECT_THROW(sampler.Reset(options), tvm::ffi::Error);
  options.temperature = 1;
  options.top_p = 1.5;
  EXPECT_THROW(sampler.Reset(options), tvm::ffi::Error);
}

TEST(LlmSha256, KnownDigests) {
  EXPECT_EQ(Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  // 56 bytes: the length no longer fits the first block.
  EXPECT_EQ(Sha256Hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(Sha256Hex(std::string(1000000, 'a')), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(LlmPythonJson, WritesWhatPythonsJsonDumpsSortKeysWrites) {
  // Expected: json.dumps(json.loads(text), sort_keys=True) in Python.
  std::string text = R"({"b": [1, 2.5, 10000.0, 1e-06, 1e+16, 0.0001, -3.0, 123456789.125],
                         "a": {"z": null, "y": true, "x": "caf\u00e9 \"q\"\n"}, "eps": 1e-05})";
  EXPECT_EQ(PythonJsonDumps(tvm::ffi::json::Parse(text)),
            R"({"a": {"x": "caf\u00e9 \"q\"\n", "y": true, "z": null}, )"
            R"("b": [1, 2.5, 10000.0, 1e-06, 1e+16, 0.0001, -3.0, 123456789.125], "eps": 1e-05})");
}

}  // namespace
}  // namespace llm
}  // namespace tvm_hetero
