/*!
 * \file support/cpu_features.cc
 * \brief This CPU's instruction-set extensions under LLVM's names (which names, and why the others
 *        are ignored or refused: cpu_features.h). One table row per name: where the CPU reports it.
 */
#include "support/cpu_features.h"

#include <cstdint>

#if defined(__x86_64__)
#include <cpuid.h>
#elif defined(__aarch64__) && defined(__linux__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

namespace tvm_hetero {
namespace support {

namespace {

#if defined(__x86_64__)

enum Register { kEax, kEbx, kEcx, kEdx };

/*! \brief The register state the OS must save for an extension's instructions to run (XCR0 bits). */
enum OsState : uint64_t {
  kNoState = 0,
  kYmm = 0x6,      // SSE and AVX halves
  kZmm = 0xE6,     // plus the AVX-512 mask and upper registers
  kTiles = 0x60000,  // AMX tile configuration and data
  kApx = 0x80000,  // APX's extended general registers
};

/*! \brief One name: cpuid (leaf, subleaf) register bit, and the OS state its instructions need. */
struct X86Feature {
  const char* name;
  uint32_t leaf, subleaf;
  Register reg;
  int bit;
  OsState state;
};

constexpr uint32_t kExt = 0x80000001;

constexpr X86Feature kX86[] = {
    {"x87", 1, 0, kEdx, 0, kNoState},        {"cx8", 1, 0, kEdx, 8, kNoState},
    {"cmov", 1, 0, kEdx, 15, kNoState},      {"mmx", 1, 0, kEdx, 23, kNoState},
    {"fxsr", 1, 0, kEdx, 24, kNoState},      {"sse", 1, 0, kEdx, 25, kNoState},
    {"sse2", 1, 0, kEdx, 26, kNoState},      {"sse3", 1, 0, kEcx, 0, kNoState},
    {"pclmul", 1, 0, kEcx, 1, kNoState},     {"ssse3", 1, 0, kEcx, 9, kNoState},
    {"fma", 1, 0, kEcx, 12, kYmm},           {"cx16", 1, 0, kEcx, 13, kNoState},
    {"sse4.1", 1, 0, kEcx, 19, kNoState},    {"sse4.2", 1, 0, kEcx, 20, kNoState},
    {"crc32", 1, 0, kEcx, 20, kNoState},     {"movbe", 1, 0, kEcx, 22, kNoState},
    {"popcnt", 1, 0, kEcx, 23, kNoState},    {"aes", 1, 0, kEcx, 25, kNoState},
    {"avx", 1, 0, kEcx, 28, kYmm},           {"f16c", 1, 0, kEcx, 29, kYmm},
    {"bmi", 7, 0, kEbx, 3, kNoState},        {"avx2", 7, 0, kEbx, 5, kYmm},
    {"bmi2", 7, 0, kEbx, 8, kNoState},       {"avx512f", 7, 0, kEbx, 16, kZmm},
    {"avx512dq", 7, 0, kEbx, 17, kZmm},      {"adx", 7, 0, kEbx, 19, kNoState},
    {"avx512ifma", 7, 0, kEbx, 21, kZmm},    {"avx512cd", 7, 0, kEbx, 28, kZmm},
    {"sha", 7, 0, kEbx, 29, kNoState},       {"avx512bw", 7, 0, kEbx, 30, kZmm},
    {"avx512vl", 7, 0, kEbx, 31, kZmm},      {"avx512vbmi", 7, 0, kEcx, 1, kZmm},
    {"avx512vbmi2", 7, 0, kEcx, 6, kZmm},    {"gfni", 7, 0, kEcx, 8, kNoState},
    {"vaes", 7, 0, kEcx, 9, kYmm},           {"vpclmulqdq", 7, 0, kEcx, 10, kYmm},
    {"avx512vnni", 7, 0, kEcx, 11, kZmm},    {"avx512bitalg", 7, 0, kEcx, 12, kZmm},
    {"avx512vpopcntdq", 7, 0, kEcx, 14, kZmm}, {"avx512vp2intersect", 7, 0, kEdx, 8, kZmm},
    {"amx-bf16", 7, 0, kEdx, 22, kTiles},    {"avx512fp16", 7, 0, kEdx, 23, kZmm},
    {"amx-tile", 7, 0, kEdx, 24, kTiles},    {"amx-int8", 7, 0, kEdx, 25, kTiles},
    {"avxvnni", 7, 1, kEax, 4, kYmm},        {"avx512bf16", 7, 1, kEax, 5, kZmm},
    {"amx-fp16", 7, 1, kEax, 21, kTiles},    {"avxifma", 7, 1, kEax, 23, kYmm},
    {"avxvnniint8", 7, 1, kEdx, 4, kYmm},    {"avxneconvert", 7, 1, kEdx, 5, kYmm},
    {"amx-complex", 7, 1, kEdx, 8, kTiles},  {"avxvnniint16", 7, 1, kEdx, 10, kYmm},
    // APX: one cpuid bit for all of LLVM's names of it.
    {"egpr", 7, 1, kEdx, 21, kApx},          {"ndd", 7, 1, kEdx, 21, kApx},
    {"ppx", 7, 1, kEdx, 21, kApx},           {"push2pop2", 7, 1, kEdx, 21, kApx},
    {"ccmp", 7, 1, kEdx, 21, kApx},          {"nf", 7, 1, kEdx, 21, kApx},
    {"cf", 7, 1, kEdx, 21, kApx},            {"zu", 7, 1, kEdx, 21, kApx},
    {"sahf", kExt, 0, kEcx, 0, kNoState},    {"lzcnt", kExt, 0, kEcx, 5, kNoState},
    {"sse4a", kExt, 0, kEcx, 6, kNoState},   {"prfchw", kExt, 0, kEcx, 8, kNoState},
    {"xop", kExt, 0, kEcx, 11, kYmm},        {"fma4", kExt, 0, kEcx, 16, kYmm},
    {"tbm", kExt, 0, kEcx, 21, kNoState},    {"64bit", kExt, 0, kEdx, 29, kNoState},
};

/*! \brief The four registers of cpuid (leaf, subleaf); zeros for a leaf beyond the CPU's last. */
void Cpuid(uint32_t leaf, uint32_t subleaf, uint32_t regs[4]) {
  regs[0] = regs[1] = regs[2] = regs[3] = 0;
  __get_cpuid_count(leaf, subleaf, &regs[0], &regs[1], &regs[2], &regs[3]);
}

/*! \brief The register state the OS saves (XCR0); 0 when it does not enable xgetbv. */
uint64_t OsSavedState() {
  uint32_t regs[4];
  Cpuid(1, 0, regs);
  if (!(regs[kEcx] & (1u << 27))) return 0;  // OSXSAVE
  uint32_t low, high;
  __asm__ volatile("xgetbv" : "=a"(low), "=d"(high) : "c"(0));
  return (static_cast<uint64_t>(high) << 32) | low;
}

std::set<std::string> ReadFeatures() {
  uint64_t saved = OsSavedState();
  std::set<std::string> found;
  for (const X86Feature& f : kX86) {
    uint32_t regs[4];
    Cpuid(f.leaf, f.subleaf, regs);
    if ((regs[f.reg] >> f.bit & 1u) && (saved & f.state) == f.state) found.insert(f.name);
  }
  return found;
}

bool InTable(const std::string& name) {
  for (const X86Feature& f : kX86) {
    if (name == f.name) return true;
  }
  return false;
}

#elif defined(__aarch64__) && defined(__linux__)

/*! \brief One name: the AT_HWCAP and AT_HWCAP2 bits that must all be set. */
struct ArmFeature {
  const char* name;
  unsigned long hwcap, hwcap2;
};

constexpr ArmFeature kArm[] = {
    {"fp-armv8", HWCAP_FP, 0},
    {"neon", HWCAP_ASIMD, 0},
    {"aes", HWCAP_AES | HWCAP_PMULL, 0},
    {"sha2", HWCAP_SHA1 | HWCAP_SHA2, 0},
    {"sha3", HWCAP_SHA3 | HWCAP_SHA512, 0},
    {"sm4", HWCAP_SM3 | HWCAP_SM4, 0},
    {"crc", HWCAP_CRC32, 0},
    {"lse", HWCAP_ATOMICS, 0},
    {"rdm", HWCAP_ASIMDRDM, 0},
    {"fullfp16", HWCAP_FPHP | HWCAP_ASIMDHP, 0},
    {"fp16fml", HWCAP_ASIMDFHM, 0},
    {"dotprod", HWCAP_ASIMDDP, 0},
    {"jsconv", HWCAP_JSCVT, 0},
    {"complxnum", HWCAP_FCMA, 0},
    {"rcpc", HWCAP_LRCPC, 0},
    {"flagm", HWCAP_FLAGM, 0},
    {"sve", HWCAP_SVE, 0},
    {"sve2", 0, HWCAP2_SVE2},
    {"i8mm", 0, HWCAP2_I8MM},
    {"bf16", 0, HWCAP2_BF16},
#ifdef HWCAP2_SME
    {"sme", 0, HWCAP2_SME},
#endif
};

std::set<std::string> ReadFeatures() {
  unsigned long hwcap = getauxval(AT_HWCAP), hwcap2 = getauxval(AT_HWCAP2);
  std::set<std::string> found;
  for (const ArmFeature& f : kArm) {
    if ((hwcap & f.hwcap) == f.hwcap && (hwcap2 & f.hwcap2) == f.hwcap2) found.insert(f.name);
  }
  return found;
}

bool InTable(const std::string& name) {
  for (const ArmFeature& f : kArm) {
    if (name == f.name) return true;
  }
  return false;
}

#else

std::set<std::string> ReadFeatures() { return {}; }
bool InTable(const std::string&) { return false; }

#endif

/*! \brief Whether `name` names a vector extension (whose instructions fault where it is absent). */
bool IsVectorExtension(const std::string& name) {
  static const char* const kPrefixes[] = {"avx", "sse", "amx", "fma", "xop", "f16c", "3dnow", "mmx", "neon", "sve",
                                          "sme"};
  for (const char* prefix : kPrefixes) {
    if (name.rfind(prefix, 0) == 0) return true;
  }
  return false;
}

}  // namespace

const std::set<std::string>& ThisCpuFeatures() {
  static const std::set<std::string> features = ReadFeatures();
  return features;
}

bool IsReadableFeature(const std::string& name) { return InTable(name); }

bool MayFault(const std::string& name) { return InTable(name) || IsVectorExtension(name); }

std::vector<std::string> MissingFeatures(const std::vector<std::string>& recorded, const std::set<std::string>& has) {
  std::vector<std::string> missing;
  for (const std::string& name : recorded) {
    if (MayFault(name) && !has.count(name)) missing.push_back(name);
  }
  return missing;
}

}  // namespace support
}  // namespace tvm_hetero
