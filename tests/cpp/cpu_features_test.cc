// This CPU's features under LLVM's names (src/support/cpu_features.h): they agree with what the kernel
// lists in /proc/cpuinfo, and only a name whose absence can fault counts as missing.
#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "support/cpu_features.h"

namespace tvm_hetero {
namespace {

#if defined(__x86_64__)
constexpr const char* kFlagsLine = "flags";
/*! \brief LLVM's name and the kernel's /proc/cpuinfo flag of the same extension. */
const std::vector<std::pair<std::string, std::string>> kSameExtension = {
    {"sse2", "sse2"},          {"sse3", "pni"},           {"ssse3", "ssse3"},
    {"sse4.1", "sse4_1"},      {"sse4.2", "sse4_2"},      {"popcnt", "popcnt"},
    {"cx16", "cx16"},          {"movbe", "movbe"},        {"sahf", "lahf_lm"},
    {"lzcnt", "abm"},          {"bmi", "bmi1"},           {"bmi2", "bmi2"},
    {"adx", "adx"},            {"prfchw", "3dnowprefetch"}, {"aes", "aes"},
    {"pclmul", "pclmulqdq"},   {"sha", "sha_ni"},         {"gfni", "gfni"},
    {"vaes", "vaes"},          {"avx", "avx"},            {"avx2", "avx2"},
    {"fma", "fma"},            {"f16c", "f16c"},          {"avx512f", "avx512f"},
    {"avx512dq", "avx512dq"},  {"avx512bw", "avx512bw"},  {"avx512vl", "avx512vl"},
    {"avx512cd", "avx512cd"},  {"avx512vnni", "avx512_vnni"}, {"avx512bf16", "avx512_bf16"},
    {"avx512fp16", "avx512_fp16"}, {"avxvnni", "avx_vnni"}, {"amx-tile", "amx_tile"},
};
#elif defined(__aarch64__)
constexpr const char* kFlagsLine = "Features";
const std::vector<std::pair<std::string, std::string>> kSameExtension = {
    {"fp-armv8", "fp"}, {"neon", "asimd"}, {"crc", "crc32"},   {"lse", "atomics"}, {"dotprod", "asimddp"},
    {"rdm", "asimdrdm"}, {"sve", "sve"},   {"sve2", "sve2"},   {"i8mm", "i8mm"},   {"bf16", "bf16"},
};
#else
constexpr const char* kFlagsLine = "";
const std::vector<std::pair<std::string, std::string>> kSameExtension = {};
#endif

/*! \brief The flags of the first CPU in /proc/cpuinfo (empty where there is none). */
std::set<std::string> ProcCpuinfoFlags() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; *kFlagsLine && std::getline(in, line);) {
    if (line.rfind(kFlagsLine, 0) != 0 || line.find(':') == std::string::npos) continue;
    std::istringstream words(line.substr(line.find(':') + 1));
    std::set<std::string> flags;
    for (std::string flag; words >> flag;) flags.insert(flag);
    return flags;
  }
  return {};
}

TEST(CpuFeatures, ThisCpuHasWhatTheKernelListsInProcCpuinfo) {
  std::set<std::string> listed = ProcCpuinfoFlags();
  if (listed.empty()) GTEST_SKIP() << "no CPU flags in /proc/cpuinfo on this system";
  const std::set<std::string>& has = support::ThisCpuFeatures();
  for (const auto& [llvm_name, flag] : kSameExtension) {
    EXPECT_EQ(has.count(llvm_name), listed.count(flag)) << llvm_name << " (/proc/cpuinfo: " << flag << ")";
  }
}

TEST(CpuFeatures, ReportsOnlyNamesItCanRead) {
  for (const std::string& name : support::ThisCpuFeatures()) EXPECT_TRUE(support::IsReadableFeature(name)) << name;
#if defined(__x86_64__)
  EXPECT_TRUE(support::ThisCpuFeatures().count("sse2"));  // every x86-64 CPU has it
#endif
}

TEST(CpuFeatures, OnlyANameWhoseAbsenceCanFaultIsMissing) {
  // Tuning (fast-gather, macrofusion) and intrinsic-only (pku) names never count; a vector extension
  // counts whether or not it can be read (avx10.1 cannot), unless the CPU is stated to have it.
  std::vector<std::string> recorded = {"sse2", "avx512f", "fast-gather", "avx10.1", "pku", "macrofusion"};
  EXPECT_EQ(support::MissingFeatures(recorded, {"sse2"}), (std::vector<std::string>{"avx512f", "avx10.1"}));
  EXPECT_EQ(support::MissingFeatures(recorded, {"sse2", "avx10.1"}), std::vector<std::string>{"avx512f"});
  EXPECT_TRUE(support::MissingFeatures(recorded, {"sse2", "avx512f", "avx10.1"}).empty());
  EXPECT_FALSE(support::MayFault("prefer-256-bit"));
#if defined(__x86_64__)
  EXPECT_TRUE(support::MayFault("bmi2"));  // scalar, but LLVM emits it from plain code
  EXPECT_EQ(support::MissingFeatures({"bmi2", "popcnt", "rdrnd"}, {"popcnt"}), std::vector<std::string>{"bmi2"});
#endif
}

}  // namespace
}  // namespace tvm_hetero
