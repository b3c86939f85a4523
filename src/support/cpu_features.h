/*!
 * \file support/cpu_features.h
 * \brief Which instruction-set extensions this CPU has, under LLVM's feature names: the names an
 *        export records of the CPU its kernels were compiled for (the manifest's "compiled_for",
 *        python/tvm_hetero/llm/this_cpu.py), so that a loader refuses kernels this CPU cannot run
 *        before it loads them, instead of dying on an illegal instruction.
 *
 * The names it reads (the tables in cpu_features.cc):
 *  - x86-64, from cpuid and the register state the OS enables (xgetbv: no AVX or AVX-512 name is
 *    reported when the OS does not save those registers): x87, mmx, cmov, cx8, cx16, fxsr, sahf,
 *    64bit, sse, sse2, sse3, ssse3, sse4.1, sse4.2, sse4a, crc32, popcnt, lzcnt, bmi, bmi2, tbm, adx,
 *    movbe, prfchw, aes, pclmul, sha, gfni, vaes, vpclmulqdq, avx, avx2, fma, fma4, xop, f16c, every
 *    avx512* of leaf 7 (f, dq, cd, bw, vl, ifma, vbmi, vbmi2, vnni, bitalg, vpopcntdq, bf16, fp16,
 *    vp2intersect), avxvnni, avxifma, avxvnniint8, avxvnniint16, avxneconvert, amx-tile, amx-int8,
 *    amx-bf16, amx-fp16, amx-complex, and APX (egpr, ndd, ppx, push2pop2, ccmp, nf, cf, zu);
 *  - aarch64 Linux, from getauxval(AT_HWCAP, AT_HWCAP2): fp-armv8, neon, aes, sha2, sha3, sm4, crc,
 *    lse, rdm, fullfp16, fp16fml, dotprod, jsconv, complxnum, rcpc, flagm, sve, sve2, i8mm, bf16, sme;
 *  - elsewhere: none.
 *
 * A recorded name it cannot read is judged by what it names:
 *  - a vector extension (a name beginning avx, sse, amx, fma, xop, f16c, 3dnow, mmx, neon, sve or
 *    sme; e.g. avx10.1) counts as missing: its instructions fault, so it is never assumed;
 *  - any other name is ignored. LLVM's tuning names (fast-*, slow-*, macrofusion, prefer-256-bit...)
 *    change how code is scheduled, not which instructions it uses; system and intrinsic-only
 *    extensions (xsave*, rdrnd, rdseed, pku, shstk, wbnoinvd, clwb, serialize, ...; aarch64's
 *    v8.Xa version names, whose instructions the record names one by one) are emitted by LLVM only
 *    where code calls their intrinsics, which compiled tensor kernels do not. A scalar extension
 *    newer than the tables would be ignored too: it needs a row.
 */
#ifndef TVM_HETERO_SUPPORT_CPU_FEATURES_H_
#define TVM_HETERO_SUPPORT_CPU_FEATURES_H_

#include <set>
#include <string>
#include <vector>

namespace tvm_hetero {
namespace support {

/*! \brief The names of the tables this CPU has (read once). */
const std::set<std::string>& ThisCpuFeatures();

/*! \brief Whether ThisCpuFeatures can tell `name` on this architecture. */
bool IsReadableFeature(const std::string& name);

/*! \brief Whether kernels compiled with `name` may fault on a CPU lacking it (see the file comment). */
bool MayFault(const std::string& name);

/*! \brief The names of `recorded` that may fault and are not in `has`, in `recorded`'s order. */
std::vector<std::string> MissingFeatures(const std::vector<std::string>& recorded, const std::set<std::string>& has);

}  // namespace support
}  // namespace tvm_hetero

#endif  // TVM_HETERO_SUPPORT_CPU_FEATURES_H_
