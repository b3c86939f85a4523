/*!
 * \file run_artifact.cc
 * \brief Run an exported tvm-hetero artifact from C++, with no Python:
 *
 *   run_artifact DIR [--expect-sum FILE] [cpu:0 cpu:1 ...]
 *
 * DIR holds graph.json, lib.so and params.bin (Artifact.export). Devices default to cpu:0, cpu:1.
 * Inputs that are not parameters are filled with a deterministic ramp; the outputs' checksums print.
 * With --expect-sum, output 0's sum must match the number in FILE (relative 1e-4) or it exits 1.
 *
 * Build it against an installed wheel with examples/CMakeLists.txt (docs/runtime.md, "C++ deploy"), or
 * from the source tree with the top-level CMakeLists.txt.
 */
#include <tvm/ffi/container/map.h>
#include <tvm/ffi/extra/module.h>
#include <tvm/ffi/function.h>
#include <tvm_hetero/graph_runtime.h>
#include <tvm_hetero/param_blob.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace ffi = tvm::ffi;

static std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

static DLDevice ParseDevice(const std::string& spec) {
  size_t colon = spec.find(':');
  std::string kind = spec.substr(0, colon);
  int index = colon == std::string::npos ? 0 : std::stoi(spec.substr(colon + 1));
  if (kind == "cpu") return DLDevice{kDLCPU, index};
  if (kind == "cuda") return DLDevice{kDLCUDA, index};
  throw std::runtime_error("unknown device " + spec);
}

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: run_artifact DIR [cpu:0 cpu:1 ...]\n";
    return 2;
  }
  try {
    std::string dir = argv[1];
    std::vector<DLDevice> devices;
    double expected_sum = 0;
    bool check_sum = false;
    for (int i = 2; i < argc; ++i) {
      if (std::string(argv[i]) == "--expect-sum" && i + 1 < argc) {
        expected_sum = std::stod(ReadFile(argv[++i]));
        check_sum = true;
      } else {
        devices.push_back(ParseDevice(argv[i]));
      }
    }
    if (devices.empty()) devices = {{kDLCPU, 0}, {kDLCPU, 1}};

    ffi::Module lib = ffi::Module::LoadFromFile(dir + "/lib.so");
    tvm_hetero::GraphRuntime runtime;
    runtime.Init(ReadFile(dir + "/graph.json"), lib, devices);
    std::string params = ReadFile(dir + "/params.bin");
    runtime.LoadParams(params, dir + "/params.bin");  // validated whole; errors name the file

    // Which inputs are parameters: those named in params.bin.
    std::set<std::string> named;
    for (const tvm_hetero::NamedParam& p : tvm_hetero::ReadParamBlob(params, dir + "/params.bin")) {
      named.insert(p.name);
    }
    const tvm_hetero::Graph& graph = runtime.graph();
    for (int i = 0; i < runtime.NumInputs(); ++i) {
      const std::string& name = runtime.GetInputName(i);
      if (named.count(name)) continue;
      ffi::Tensor input = runtime.GetInput(i);
      std::vector<float> values(ffi::GetDataSize(*input.GetDLTensorPtr()) / sizeof(float));
      for (size_t k = 0; k < values.size(); ++k) values[k] = static_cast<float>(k % 17) / 17.0f - 0.5f;
      DLTensor host = *input.GetDLTensorPtr();
      host.data = values.data();
      host.device = DLDevice{kDLCPU, 0};
      runtime.SetInput(i, &host);
      std::printf("input %s: %zu values\n", name.c_str(), values.size());
    }
    runtime.Run();
    for (int i = 0; i < runtime.NumOutputs(); ++i) {
      ffi::Tensor out = runtime.GetOutput(i);
      std::vector<float> values(ffi::GetDataSize(*out.GetDLTensorPtr()) / sizeof(float));
      DLTensor host = *out.GetDLTensorPtr();
      host.data = values.data();
      host.device = DLDevice{kDLCPU, 0};
      runtime.CopyOutputTo(i, &host);
      double sum = 0;
      for (float v : values) sum += v;
      std::printf("output %d: %zu values, sum %.6f\n", i, values.size(), sum);
      if (i == 0 && check_sum && std::abs(sum - expected_sum) > 1e-4 * std::max(1.0, std::abs(expected_sum))) {
        std::fprintf(stderr, "output 0 sum %.6f differs from the expected %.6f\n", sum, expected_sum);
        return 1;
      }
    }
    std::printf("nodes %zu, groups %zu\n%s\n", graph.nodes.size(), runtime.groups().size(),
                runtime.StatsJSON().c_str());
    return 0;
  } catch (const std::exception& err) {
    std::cerr << "error: " << err.what() << "\n";
    return 1;
  }
}
