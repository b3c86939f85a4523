/*!
 * \file generate.cc
 * \brief Generate tokens from an exported language model in C++, with no Python:
 *
 *   generate DIR --prompt-ids 1,2,3 [--max-new-tokens N] [--temperature T] [--top-k K] [--top-p P]
 *            [--seed S] [--stop-tokens 2,3]
 *   generate DIR --check FILE [--max-new-tokens N]
 *
 * DIR is a directory written by `LanguageModel.export` (python/tvm_hetero/llm/export.py). The new
 * token ids print as they are chosen, then prefill and decode tokens per second. With --check, FILE
 * holds "prompt ids<TAB>expected greedy ids" (examples/export_tiny_llm.py writes one); the program
 * generates greedily from that prompt and exits 1 unless the tokens are the expected ones.
 */
#include <tvm_hetero/llm/generation_session.h>

#include <cstdio>
#include <exception>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace llm = tvm_hetero::llm;

static std::vector<int64_t> ParseIds(const std::string& text, const std::string& what) {
  std::vector<int64_t> ids;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    size_t used = 0;
    try {
      ids.push_back(std::stoll(item, &used));
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size()) throw std::runtime_error(what + ": '" + item + "' is not a token id");
  }
  return ids;
}

static int Usage() {
  std::cerr << "usage: generate DIR (--prompt-ids 1,2,3 | --check FILE) [--max-new-tokens N] [--temperature T]\n"
               "                [--top-k K] [--top-p P] [--seed S] [--stop-tokens 2,3]\n";
  return 2;
}

int main(int argc, char** argv) {
  if (argc < 2) return Usage();
  try {
    std::string dir = argv[1];
    std::vector<int64_t> prompt, expected;
    bool check = false;
    llm::GenerationOptions options;
    options.max_new_tokens = 32;
    for (int i = 2; i < argc; ++i) {
      std::string flag = argv[i];
      if (i + 1 >= argc) return Usage();
      std::string value = argv[++i];
      if (flag == "--prompt-ids") {
        prompt = ParseIds(value, flag);
      } else if (flag == "--check") {
        std::ifstream in(value);
        std::string prompt_text, expected_text;
        if (!std::getline(in, prompt_text, '\t') || !std::getline(in, expected_text)) {
          throw std::runtime_error(value + ": expected 'prompt ids<TAB>expected ids'");
        }
        prompt = ParseIds(prompt_text, value);
        expected = ParseIds(expected_text, value);
        options.max_new_tokens = static_cast<int64_t>(expected.size());
        check = true;
      } else if (flag == "--max-new-tokens") {
        options.max_new_tokens = std::stoll(value);
      } else if (flag == "--temperature") {
        options.sampling.temperature = std::stod(value);
      } else if (flag == "--top-k") {
        options.sampling.top_k = std::stoll(value);
      } else if (flag == "--top-p") {
        options.sampling.top_p = std::stod(value);
      } else if (flag == "--seed") {
        options.sampling.seed = std::stoull(value);
      } else if (flag == "--stop-tokens") {
        options.stop_tokens.emplace();
        for (int64_t id : ParseIds(value, flag)) options.stop_tokens->push_back(static_cast<int32_t>(id));
      } else {
        return Usage();
      }
    }
    if (prompt.empty() && !check) return Usage();

    auto model = llm::LanguageModel::Load(dir);  // checksums verified, weights loaded once
    llm::GenerationSession session(model);
    std::printf("%s: %s, vocabulary %lld, capacity %lld\nnew tokens:", dir.c_str(), model->shape().model_type.c_str(),
                static_cast<long long>(model->shape().vocab_size), static_cast<long long>(model->capacity()));
    std::vector<int32_t> tokens = session.Generate(prompt, options, [](int32_t token) {
      std::printf(" %d", token);
      std::fflush(stdout);
    });
    const llm::GenerationTimes& t = session.times();
    std::printf("\nprefill: %lld tokens, %.1f tokens/s\ndecode: %lld steps, %.1f tokens/s\n",
                static_cast<long long>(t.prompt_tokens), t.prompt_tokens / t.prefill_seconds,
                static_cast<long long>(t.decode_steps), t.decode_steps > 0 ? t.decode_steps / t.decode_seconds : 0.0);
    if (check && std::vector<int64_t>(tokens.begin(), tokens.end()) != expected) {
      std::fprintf(stderr, "the tokens differ from the expected ones in the check file\n");
      return 1;
    }
    return 0;
  } catch (const std::exception& err) {
    std::cerr << "error: " << err.what() << "\n";
    return 1;
  }
}
