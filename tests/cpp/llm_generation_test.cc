/*!
 * \file llm_generation_test.cc
 * \brief The C++ generation loop on a tiny exported Llama (examples/export_tiny_llm.py, run by ctest
 *        as the fixture llm_artifact; its directory comes in TVM_HETERO_LLM_DIR): greedy tokens equal
 *        the Python loop's, streaming, seeds, stop tokens, the cache written only at its new rows,
 *        bad input and damaged files refused naming them, a CPU lacking a recorded feature refused
 *        naming it, two sessions on two threads as serial.
 */
#include <gtest/gtest.h>
#include <tvm/ffi/error.h>
#include <tvm_hetero/llm/generation_session.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <new>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

/*! \brief Every operator new of this process (this binary replaces the global one to count them). */
static std::atomic<int64_t> g_allocations{0};

void* operator new(std::size_t size) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(size ? size : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace tvm_hetero {
namespace llm {
namespace {

namespace fs = std::filesystem;

std::string ExportedDirectory() {
  const char* dir = std::getenv("TVM_HETERO_LLM_DIR");
  if (dir == nullptr) {
    ADD_FAILURE() << "TVM_HETERO_LLM_DIR is not set: run through ctest (the fixture exports the model) or "
                     "set it to a directory written by examples/export_tiny_llm.py";
    return "";
  }
  return dir;
}

std::vector<int64_t> Ids(const std::string& text) {
  std::vector<int64_t> ids;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) ids.push_back(std::stoll(item));
  return ids;
}

/*! \brief The exported model and the Python loop's greedy tokens for its prompt (loaded once). */
struct Exported {
  std::shared_ptr<const LanguageModel> model;
  std::vector<int64_t> prompt, expected;
};

const Exported& TinyModel() {
  static const Exported exported = [] {
    Exported e;
    std::string dir = ExportedDirectory();
    e.model = LanguageModel::Load(dir);
    std::ifstream in(dir + "/expected_tokens.txt");
    std::string prompt, expected;
    std::getline(in, prompt, '\t');
    std::getline(in, expected);
    e.prompt = Ids(prompt);
    e.expected = Ids(expected);
    return e;
  }();
  return exported;
}

GenerationOptions Greedy(int64_t max_new_tokens) {
  GenerationOptions options;
  options.max_new_tokens = max_new_tokens;
  options.stop_tokens.emplace();  // run the full length
  return options;
}

std::vector<int64_t> AsInt64(const std::vector<int32_t>& tokens) { return {tokens.begin(), tokens.end()}; }

/*! \brief The message of the tvm::ffi::Error `run` throws (empty: none was thrown). */
template <typename F>
std::string ErrorOf(F run) {
  try {
    run();
  } catch (const tvm::ffi::Error& err) {
    return err.what();
  }
  return "";
}

TEST(LlmGeneration, GreedyTokensEqualThePythonLoops) {
  const Exported& e = TinyModel();
  GenerationSession session(e.model);
  EXPECT_EQ(AsInt64(session.Generate(e.prompt, Greedy(e.expected.size()))), e.expected);
  // Again on the same session: the cache is reset, not appended to.
  EXPECT_EQ(AsInt64(session.Generate(e.prompt, Greedy(e.expected.size()))), e.expected);
}

TEST(LlmGeneration, TheCallbackSeesEveryTokenInOrderAndTimesAreCounted) {
  const Exported& e = TinyModel();
  GenerationSession session(e.model);
  std::vector<int64_t> streamed;
  std::vector<int32_t> tokens =
      session.Generate(e.prompt, Greedy(e.expected.size()), [&](int32_t token) { streamed.push_back(token); });
  EXPECT_EQ(streamed, AsInt64(tokens));
  EXPECT_EQ(session.times().prompt_tokens, static_cast<int64_t>(e.prompt.size()));
  EXPECT_EQ(session.times().decode_steps, static_cast<int64_t>(e.expected.size()) - 1);
  EXPECT_GT(session.times().prefill_seconds, 0);
  EXPECT_GT(session.times().decode_seconds, 0);
}

TEST(LlmGeneration, EveryPromptLengthUpToTheCapacityMatchesTokenByTokenDecoding) {
  // The chunked prefill gives the logits that feeding the prompt one token at a time gives.
  const Exported& e = TinyModel();
  GenerationSession chunked(e.model), single(e.model);
  int64_t capacity = e.model->capacity();
  std::vector<int32_t> prompt(capacity);
  for (int64_t i = 0; i < capacity; ++i) prompt[i] = static_cast<int32_t>((i * 29 + 3) % e.model->shape().vocab_size);
  for (int64_t length : {1, 7, 8, 9, 33, 40, 64}) {
    int32_t from_chunks = Sampler::Argmax(chunked.Prefill(prompt.data(), length), e.model->shape().vocab_size);
    const float* logits = single.Prefill(prompt.data(), 1);
    for (int64_t i = 1; i < length; ++i) logits = single.Decode(prompt[i]);
    EXPECT_EQ(from_chunks, Sampler::Argmax(logits, e.model->shape().vocab_size)) << "prompt of " << length;
    EXPECT_EQ(chunked.filled(), length);
  }
}

TEST(LlmGeneration, TheTokenLoopAllocatesNothing) {
  // The export has TVM kernels only: oneDNN's primitive execute allocates on each call by itself.
  const Exported& e = TinyModel();
  GenerationSession session(e.model);
  GenerationOptions sampled = Greedy(20);
  sampled.sampling.temperature = 0.9;
  sampled.sampling.top_k = 40;
  sampled.sampling.seed = 1;
  for (const GenerationOptions& options : {Greedy(20), sampled}) {
    session.Start(e.prompt, options);
    int64_t before = g_allocations.load();
    int tokens = 0;
    while (session.Next()) ++tokens;
    EXPECT_EQ(tokens, 20);
    EXPECT_EQ(g_allocations.load(), before) << "operator new ran during the decode steps";
  }
}

TEST(LlmGeneration, ADecodeStepWritesOnlyTheNewRows) {
  const Exported& e = TinyModel();
  GenerationSession session(e.model);
  const DecoderShape& shape = e.model->shape();
  std::vector<int32_t> prompt = {1, 2, 3};
  session.Prefill(prompt.data(), 3);  // one padded chunk of 8: only 3 rows are written
  int64_t row_bytes = 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim * 4;
  EXPECT_EQ(session.cache_bytes_written(), 3 * row_bytes);
  session.Decode(4);
  EXPECT_EQ(session.cache_bytes_written(), 4 * row_bytes);
}

TEST(LlmGeneration, SameSeedSameTokensAndAStopTokenEndsTheGeneration) {
  const Exported& e = TinyModel();
  GenerationSession session(e.model);
  GenerationOptions sampled = Greedy(12);
  sampled.sampling.temperature = 1.5;
  sampled.sampling.top_p = 0.9;
  sampled.sampling.seed = 11;
  std::vector<int32_t> first = session.Generate(e.prompt, sampled);
  EXPECT_EQ(session.Generate(e.prompt, sampled), first);
  GenerationOptions stop = Greedy(e.expected.size());
  stop.stop_tokens = std::vector<int32_t>{static_cast<int32_t>(e.expected[2])};
  EXPECT_EQ(AsInt64(session.Generate(e.prompt, stop)),
            std::vector<int64_t>(e.expected.begin(), e.expected.begin() + 3));
}

TEST(LlmGeneration, BadInputIsAnErrorNamingIt) {
  const Exported& e = TinyModel();
  GenerationSession session(e.model);
  int64_t vocab = e.model->shape().vocab_size, capacity = e.model->capacity();
  EXPECT_NE(ErrorOf([&] { session.Generate({5, vocab, 7}, Greedy(2)); })
                .find("token id " + std::to_string(vocab) + " at position 1 is outside the vocabulary"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] { session.Generate({-3}, Greedy(2)); }).find("token id -3 at position 0"), std::string::npos);
  EXPECT_NE(ErrorOf([&] { session.Generate({}, Greedy(2)); }).find("the prompt is empty"), std::string::npos);
  std::vector<int64_t> too_long(capacity + 1, 1);
  EXPECT_NE(ErrorOf([&] { session.Generate(too_long, Greedy(1)); })
                .find("a prompt of " + std::to_string(capacity + 1) + " tokens exceeds the cache capacity of " +
                      std::to_string(capacity)),
            std::string::npos);
  std::vector<int64_t> fits(capacity - 2, 1);
  std::string beyond = ErrorOf([&] { session.Generate(fits, Greedy(5)); });
  EXPECT_NE(beyond.find("a prompt of " + std::to_string(capacity - 2) + " tokens and 5 new tokens"), std::string::npos)
      << beyond;
  EXPECT_NE(ErrorOf([&] { session.Generate(e.prompt, Greedy(0)); }).find("max_new_tokens"), std::string::npos);
  // The session still works after refusing.
  EXPECT_EQ(AsInt64(session.Generate(e.prompt, Greedy(e.expected.size()))), e.expected);
}

/*! \brief A copy of the exported directory in a fresh temporary folder. */
fs::path CopyOfExport(const std::string& name) {
  fs::path copy = fs::temp_directory_path() / ("tvm_hetero_llm_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(copy);
  fs::copy(ExportedDirectory(), copy, fs::copy_options::recursive);
  return copy;
}

TEST(LlmGeneration, AMissingOrDamagedFileIsRefusedNamingIt) {
  fs::path damaged = CopyOfExport("damaged");
  {
    std::fstream params(damaged / "params.bin", std::ios::in | std::ios::out | std::ios::binary);
    params.seekp(100);
    params.put('\x7f');
  }
  std::string error = ErrorOf([&] { LanguageModel::Load(damaged.string()); });
  EXPECT_NE(error.find("params.bin: checksum mismatch"), std::string::npos) << error;

  fs::path missing = CopyOfExport("missing");
  fs::remove(missing / "lib_1.so");
  error = ErrorOf([&] { LanguageModel::Load(missing.string()); });
  EXPECT_NE(error.find("lib_1.so: missing"), std::string::npos) << error;

  fs::path edited = CopyOfExport("edited");
  {
    std::ifstream in(edited / "manifest.json");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    size_t at = text.find("\"capacity\": ");
    ASSERT_NE(at, std::string::npos);
    text.insert(at + 12, "1");
    std::ofstream(edited / "manifest.json") << text;
  }
  error = ErrorOf([&] { LanguageModel::Load(edited.string()); });
  EXPECT_NE(error.find("manifest.json: checksum mismatch"), std::string::npos) << error;

  error = ErrorOf([&] { LanguageModel::Load((damaged / "nowhere").string()); });
  EXPECT_NE(error.find("not an exported language model (no manifest.json)"), std::string::npos) << error;
  for (const fs::path& dir : {damaged, missing, edited}) fs::remove_all(dir);
}

TEST(LlmGeneration, ACpuLackingARecordedFeatureIsRefusedNamingItAndOneWithAllOfThemLoads) {
  const Exported& e = TinyModel();
  if (!e.model->compiled_for()) GTEST_SKIP() << "the export targets its architecture's baseline: nothing to check";
  const CompiledFor& record = *e.model->compiled_for();
  std::set<std::string> all(record.features.begin(), record.features.end());
  std::string lacking;
  for (const char* vector_isa : {"avx2", "sse2", "neon"}) {
    if (all.count(vector_isa)) {
      lacking = vector_isa;
      break;
    }
  }
  if (lacking.empty()) GTEST_SKIP() << "the record names no vector extension this test knows";
  std::set<std::string> stated = all;
  stated.erase(lacking);
  std::string dir = ExportedDirectory();
  std::string error = ErrorOf([&] { LanguageModel::Load(dir, 0, stated); });
  EXPECT_NE(error.find(dir + ": its kernels were compiled for CPU '" + record.cpu + "', and the stated CPU lacks " +
                       lacking + ";"),
            std::string::npos)
      << error;
  EXPECT_EQ(LanguageModel::Load(dir, 0, all)->graphs().size(), e.model->graphs().size());
}

TEST(ConcurrentGeneration, TwoSessionsOnTwoThreadsMatchSerial) {
  const Exported& e = TinyModel();
  std::vector<int64_t> other_prompt = {9, 8, 7, 6, 5, 4, 3, 2, 1, 10, 20, 30, 40, 50};
  GenerationSession first(e.model), second(e.model);
  std::vector<int32_t> serial_first = first.Generate(e.prompt, Greedy(16));
  std::vector<int32_t> serial_second = second.Generate(other_prompt, Greedy(16));
  for (int round = 0; round < 3; ++round) {
    std::vector<int32_t> parallel_first, parallel_second;
    std::thread a([&] { parallel_first = first.Generate(e.prompt, Greedy(16)); });
    std::thread b([&] { parallel_second = second.Generate(other_prompt, Greedy(16)); });
    a.join();
    b.join();
    EXPECT_EQ(parallel_first, serial_first);
    EXPECT_EQ(parallel_second, serial_second);
  }
}

}  // namespace
}  // namespace llm
}  // namespace tvm_hetero
