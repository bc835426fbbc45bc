// Hopper warpgroup MMA (sm_90a) for the FP8 and MXFP4 logits kernels:
// shared-memory matrix descriptors for K-major tiles in the 128-byte
// swizzle, the m64nNk32 e4m3 wgmma for N = 16, 32, 64, 128, 256, the e5m2
// wgmma with A from registers for N = 16, 32, 64, 128 (N = rows x H, so
// H = 16, 32 and 64 all map), and the fences around them.
// Device code for INDEXER_GPU_WGMMA passes only; include after gpu_compat.h.
#pragma once

#include <cstdint>

#include "kernels/gpu/gpu_compat.h"

#if INDEXER_GPU_WGMMA
namespace indexer {
namespace gpu {

// Descriptor of a K-major tile of 128-byte rows in the 128-byte swizzle
// (16-byte chunk c of row r stored at chunk c ^ (r % 8)), 8-row groups
// 1024 bytes apart, in its two words. The high word (SBO 1024 bytes, the
// 128-byte swizzle) is the same for every such tile, so a loop can carry
// the low word alone (start address in 16-byte units, LBO 1, unused) and
// add its offsets there; Sw128DescOfLo joins them, the high word an
// immediate the compiler can see. REQUIRES: the tile starts 1024-byte
// aligned; adding 32 * k bytes to the address selects the k-th k32 slice.
inline constexpr uint32_t kSw128DescHi = (1024u >> 4) | (1u << 30);
__device__ __forceinline__ uint32_t Sw128DescLo(uint32_t shared_addr) {
  return ((shared_addr & 0x3ffffu) >> 4) | (1u << 16);
}
__device__ __forceinline__ uint64_t Sw128DescOfLo(uint32_t lo) {
  return (static_cast<uint64_t>(kSw128DescHi) << 32) | lo;
}
__device__ __forceinline__ uint64_t Sw128KMajorDesc(const void* smem) {
  return Sw128DescOfLo(Sw128DescLo(static_cast<uint32_t>(__cvta_generic_to_shared(smem))));
}

// `desc` with `add` (16-byte units) added to its start-address field alone:
// a 32-bit add on the low word, where a 64-bit add costs a carry chain
// and register moves before every wgmma. REQUIRES: the field does not
// overflow (shared addresses stay below 256 KiB).
__device__ __forceinline__ uint64_t DescPlus(uint64_t desc, uint32_t add) {
  uint64_t r;
  asm("{\n.reg .b32 lo, hi;\nmov.b64 {lo, hi}, %1;\nadd.u32 lo, lo, %2;\nmov.b64 %0, {lo, hi};\n}\n"
      : "=l"(r)
      : "l"(desc), "r"(add));
  return r;
}

__device__ __forceinline__ void WgmmaFence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void WgmmaCommit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void WgmmaWaitAll() {
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}
// Orders this thread's generic-proxy shared writes (st.shared, cp.async)
// before later async-proxy reads (wgmma operands).
__device__ __forceinline__ void FenceProxyAsyncShared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// 16 (4) bytes global -> shared, asynchronous; zero-filled when !valid.
__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem, bool valid) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem),
               "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void CpAsync4(void* smem, const void* gmem, bool valid) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(gmem),
               "r"(valid ? 4 : 0) : "memory");
}
__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Waits until at most kPending of this thread's groups are in flight.
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// ---- mbarriers and the bulk copy engine ----------------------------------
__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// The dynamic shared memory `raw` rounded up to a multiple of 1024 bytes
// (the 128-byte swizzle's repeat), by pointer arithmetic on the shared
// array itself: the compiler keeps the shared state space, so loads and
// atomics through the result are LDS / ATOMS. (Rounding through uintptr_t
// lost it: every shared read of the math warpgroups compiled to a generic
// LD, which waits on the L1TEX scoreboard.)
__device__ __forceinline__ uint8_t* AlignSmem1024(uint8_t* raw) {
  return raw + ((1024u - (SmemAddr(raw) & 1023u)) & 1023u);
}
__device__ __forceinline__ void MbarInit(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(SmemAddr(bar)), "r"(count) : "memory");
}
// Makes initialized barriers visible to the async proxy.
__device__ __forceinline__ void FenceMbarInit() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void MbarArriveExpectTx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(SmemAddr(bar)), "r"(bytes)
               : "memory");
}
// The barrier at shared address `bar` (SmemAddr): loops that index an array
// of barriers take its address once, not a generic-to-shared conversion
// per use.
__device__ __forceinline__ void MbarWait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\nWAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n}\n" ::"r"(bar), "r"(parity) : "memory");
}
__device__ __forceinline__ void MbarWait(uint64_t* bar, uint32_t parity) { MbarWait(SmemAddr(bar), parity); }
// 16 bytes from shared address `a` (SmemAddr; 16-byte aligned).
__device__ __forceinline__ int4 LdsInt4(uint32_t a) {
  int4 v;
  asm volatile("ld.shared.v4.s32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a));
  return v;
}
// One arrival on `bar` (no transaction bytes): a consumer releasing a stage.
__device__ __forceinline__ void MbarArrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void MbarArrive(uint64_t* bar) { MbarArrive(SmemAddr(bar)); }
// An arrival on `bar` once every cp.async this thread issued before has
// landed (.noinc: the barrier's expected count includes it).
__device__ __forceinline__ void CpAsyncArriveNoinc(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(SmemAddr(bar)) : "memory");
}
// Barrier `id` (1..15; 0 is __syncthreads) over `threads` threads, a whole
// number of warps: one warpgroup synchronizes without stalling the others.
__device__ __forceinline__ void NamedBarrierSync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Box {c0, c1, c2} of the 3-D tensor map `tmap` (a __grid_constant__
// parameter) into shared memory, completing on `bar`.
__device__ __forceinline__ void TmaLoad3d(void* smem, const TensorMap* tmap, int32_t c0, int32_t c1,
                                          int32_t c2, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(SmemAddr(smem)), "l"(reinterpret_cast<uint64_t>(tmap)),
      "r"(c0), "r"(c1), "r"(c2), "r"(SmemAddr(bar)) : "memory");
}
// The same with an L2 cache policy (kL2EvictFirst: lines read once, let
// go before others).
inline constexpr uint64_t kL2EvictFirst = 0x12F0000000000000ull;  // CUTLASS's CacheHintSm90 encoding
__device__ __forceinline__ void TmaLoad3dHint(void* smem, const TensorMap* tmap, int32_t c0, int32_t c1,
                                              int32_t c2, uint64_t* bar, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%2, %3, %4}], [%5], %6;\n" ::"r"(SmemAddr(smem)), "l"(reinterpret_cast<uint64_t>(tmap)),
      "r"(c0), "r"(c1), "r"(c2), "r"(SmemAddr(bar)), "l"(policy) : "memory");
}
__device__ __forceinline__ void BulkLoadHint(void* smem, const void* gmem, uint32_t bytes, uint64_t* bar,
                                             uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;\n"
      ::"r"(SmemAddr(smem)), "l"(gmem), "r"(bytes), "r"(SmemAddr(bar)), "l"(policy) : "memory");
}
// Asks the L2 for `bytes` (a multiple of 16, both ends 16-byte aligned) of
// global memory; nothing lands in shared memory and nothing completes.
__device__ __forceinline__ void BulkPrefetchL2(const void* gmem, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(gmem), "r"(bytes) : "memory");
}
// `bytes` (a multiple of 16, both ends 16-byte aligned) global -> shared.
__device__ __forceinline__ void BulkLoad(void* smem, const void* gmem, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
      ::"r"(SmemAddr(smem)), "l"(gmem), "r"(bytes), "r"(SmemAddr(bar)) : "memory");
}

// d[32] (+)= A[64x32] * B[32x64]; scale_d == 0 overwrites d.
__device__ __forceinline__ void WgmmaE4m3N64(float (&d)[32], uint64_t desc_a,
                                             uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

// d[64] (+)= A[64x32] * B[32x128]; scale_d == 0 overwrites d.
__device__ __forceinline__ void WgmmaE4m3N128(float (&d)[64], uint64_t desc_a,
                                             uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

// d[128] (+)= A[64x32] * B[32x256]; scale_d == 0 overwrites d.
__device__ __forceinline__ void WgmmaE4m3N256(float (&d)[128], uint64_t desc_a,
                                             uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

// d[32] = A[64x32] * B[32x64]: the first k-slice, overwriting d. Outputs
// only, so d is not live before it (the "+f" form keeps it live across the
// whole loop and costs a tile's worth of registers).
__device__ __forceinline__ void WgmmaE4m3N64First(float (&d)[32], uint64_t desc_a,
                                                 uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1;\n}\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]), "=f"(d[7]),
        "=f"(d[8]), "=f"(d[9]), "=f"(d[10]), "=f"(d[11]), "=f"(d[12]), "=f"(d[13]), "=f"(d[14]), "=f"(d[15]),
        "=f"(d[16]), "=f"(d[17]), "=f"(d[18]), "=f"(d[19]), "=f"(d[20]), "=f"(d[21]), "=f"(d[22]), "=f"(d[23]),
        "=f"(d[24]), "=f"(d[25]), "=f"(d[26]), "=f"(d[27]), "=f"(d[28]), "=f"(d[29]), "=f"(d[30]), "=f"(d[31])
      : "l"(desc_a), "l"(desc_b), "r"(0));
}

// d[64] = A[64x32] * B[32x128]: the first k-slice, overwriting d. Outputs
// only, so d is not live before it (the "+f" form keeps it live across the
// whole loop and costs a tile's worth of registers).
__device__ __forceinline__ void WgmmaE4m3N128First(float (&d)[64], uint64_t desc_a,
                                                 uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1;\n}\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]), "=f"(d[7]),
        "=f"(d[8]), "=f"(d[9]), "=f"(d[10]), "=f"(d[11]), "=f"(d[12]), "=f"(d[13]), "=f"(d[14]), "=f"(d[15]),
        "=f"(d[16]), "=f"(d[17]), "=f"(d[18]), "=f"(d[19]), "=f"(d[20]), "=f"(d[21]), "=f"(d[22]), "=f"(d[23]),
        "=f"(d[24]), "=f"(d[25]), "=f"(d[26]), "=f"(d[27]), "=f"(d[28]), "=f"(d[29]), "=f"(d[30]), "=f"(d[31]),
        "=f"(d[32]), "=f"(d[33]), "=f"(d[34]), "=f"(d[35]), "=f"(d[36]), "=f"(d[37]), "=f"(d[38]), "=f"(d[39]),
        "=f"(d[40]), "=f"(d[41]), "=f"(d[42]), "=f"(d[43]), "=f"(d[44]), "=f"(d[45]), "=f"(d[46]), "=f"(d[47]),
        "=f"(d[48]), "=f"(d[49]), "=f"(d[50]), "=f"(d[51]), "=f"(d[52]), "=f"(d[53]), "=f"(d[54]), "=f"(d[55]),
        "=f"(d[56]), "=f"(d[57]), "=f"(d[58]), "=f"(d[59]), "=f"(d[60]), "=f"(d[61]), "=f"(d[62]), "=f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(0));
}

// ---- A from registers (the MXFP4 kernel widens K there) ------------------
// Fragment of A (8-bit, g = lane / 4, t = lane % 4, rows of warp w of the
// warpgroup at 16 w): a[0] row g, k t*4..+3; a[1] row g + 8, same k;
// a[2] row g, k 16 + t*4..+3; a[3] row g + 8, same k. A byte is one element,
// the lowest k in the lowest byte.
// d[16] = A[64x32] * B[32x32], e5m2, A from registers: the first k-slice,
// overwriting d (outputs only, so d is not live before it).
__device__ __forceinline__ void WgmmaE5m2RegAN32First(float (&d)[16], const uint32_t (&a)[4],
                                                   uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k32.f32.e5m2.e5m2 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1;\n}\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]), "=f"(d[7]),
        "=f"(d[8]), "=f"(d[9]), "=f"(d[10]), "=f"(d[11]), "=f"(d[12]), "=f"(d[13]), "=f"(d[14]), "=f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(0));
}

// d[16] += A[64x32] * B[32x32], e5m2, A from registers.
__device__ __forceinline__ void WgmmaE5m2RegAN32(float (&d)[16], const uint32_t (&a)[4],
                                                   uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k32.f32.e5m2.e5m2 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
}

// d[32] = A[64x32] * B[32x64], e5m2, A from registers: the first k-slice,
// overwriting d (outputs only, so d is not live before it).
__device__ __forceinline__ void WgmmaE5m2RegAN64First(float (&d)[32], const uint32_t (&a)[4],
                                                   uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e5m2.e5m2 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1;\n}\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]), "=f"(d[7]),
        "=f"(d[8]), "=f"(d[9]), "=f"(d[10]), "=f"(d[11]), "=f"(d[12]), "=f"(d[13]), "=f"(d[14]), "=f"(d[15]),
        "=f"(d[16]), "=f"(d[17]), "=f"(d[18]), "=f"(d[19]), "=f"(d[20]), "=f"(d[21]), "=f"(d[22]), "=f"(d[23]),
        "=f"(d[24]), "=f"(d[25]), "=f"(d[26]), "=f"(d[27]), "=f"(d[28]), "=f"(d[29]), "=f"(d[30]), "=f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(0));
}

// d[32] += A[64x32] * B[32x64], e5m2, A from registers.
__device__ __forceinline__ void WgmmaE5m2RegAN64(float (&d)[32], const uint32_t (&a)[4],
                                                   uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e5m2.e5m2 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
}

// d[64] = A[64x32] * B[32x128], e5m2, A from registers: the first k-slice,
// overwriting d (outputs only, so d is not live before it).
__device__ __forceinline__ void WgmmaE5m2RegAN128First(float (&d)[64], const uint32_t (&a)[4],
                                                   uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e5m2.e5m2 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1;\n}\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]), "=f"(d[7]),
        "=f"(d[8]), "=f"(d[9]), "=f"(d[10]), "=f"(d[11]), "=f"(d[12]), "=f"(d[13]), "=f"(d[14]), "=f"(d[15]),
        "=f"(d[16]), "=f"(d[17]), "=f"(d[18]), "=f"(d[19]), "=f"(d[20]), "=f"(d[21]), "=f"(d[22]), "=f"(d[23]),
        "=f"(d[24]), "=f"(d[25]), "=f"(d[26]), "=f"(d[27]), "=f"(d[28]), "=f"(d[29]), "=f"(d[30]), "=f"(d[31]),
        "=f"(d[32]), "=f"(d[33]), "=f"(d[34]), "=f"(d[35]), "=f"(d[36]), "=f"(d[37]), "=f"(d[38]), "=f"(d[39]),
        "=f"(d[40]), "=f"(d[41]), "=f"(d[42]), "=f"(d[43]), "=f"(d[44]), "=f"(d[45]), "=f"(d[46]), "=f"(d[47]),
        "=f"(d[48]), "=f"(d[49]), "=f"(d[50]), "=f"(d[51]), "=f"(d[52]), "=f"(d[53]), "=f"(d[54]), "=f"(d[55]),
        "=f"(d[56]), "=f"(d[57]), "=f"(d[58]), "=f"(d[59]), "=f"(d[60]), "=f"(d[61]), "=f"(d[62]), "=f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(0));
}

// d[64] += A[64x32] * B[32x128], e5m2, A from registers.
__device__ __forceinline__ void WgmmaE5m2RegAN128(float (&d)[64], const uint32_t (&a)[4],
                                                   uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e5m2.e5m2 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
}


// ---- narrow N for H = 16 and 32 (N = rows x H) --------------------------
// d[8] (+)= A[64x32] * B[32x16]; scale_d == 0 overwrites d.
__device__ __forceinline__ void WgmmaE4m3N16(float (&d)[8], uint64_t desc_a,
                                             uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

// d[8] = A[64x32] * B[32x16]: the first k-slice, overwriting d (outputs
// only, so d is not live before it).
__device__ __forceinline__ void WgmmaE4m3N16First(float (&d)[8], uint64_t desc_a,
                                                  uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1;\n}\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]), "=f"(d[7])
      : "l"(desc_a), "l"(desc_b), "r"(0));
}

// d[16] (+)= A[64x32] * B[32x32]; scale_d == 0 overwrites d.
__device__ __forceinline__ void WgmmaE4m3N32(float (&d)[16], uint64_t desc_a,
                                             uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

// d[16] = A[64x32] * B[32x32]: the first k-slice, overwriting d (outputs
// only, so d is not live before it).
__device__ __forceinline__ void WgmmaE4m3N32First(float (&d)[16], uint64_t desc_a,
                                                  uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1;\n}\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]), "=f"(d[7]),
        "=f"(d[8]), "=f"(d[9]), "=f"(d[10]), "=f"(d[11]), "=f"(d[12]), "=f"(d[13]), "=f"(d[14]), "=f"(d[15])
      : "l"(desc_a), "l"(desc_b), "r"(0));
}

// d[8] = A[64x32] * B[32x16], e5m2, A from registers: the first k-slice,
// overwriting d (outputs only, so d is not live before it).
__device__ __forceinline__ void WgmmaE5m2RegAN16First(float (&d)[8], const uint32_t (&a)[4],
                                                      uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k32.f32.e5m2.e5m2 "
      "{%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, p, 1, 1;\n}\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]), "=f"(d[7])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(0));
}

// d[8] += A[64x32] * B[32x16], e5m2, A from registers.
__device__ __forceinline__ void WgmmaE5m2RegAN16(float (&d)[8], const uint32_t (&a)[4],
                                                 uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k32.f32.e5m2.e5m2 "
      "{%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
}

// ---- wgmma by N (a template constant: N = rows x H heads) ------------------
// C (+)= K . Q^T, both operands in shared memory; scale_d == 0 overwrites.
template <int kN>
__device__ __forceinline__ void WgmmaE4m3(float (&d)[kN / 2], uint64_t desc_a, uint64_t desc_b,
                                          int scale_d) {
  static_assert(kN == 16 || kN == 32 || kN == 64 || kN == 128 || kN == 256, "wgmma N");
  if constexpr (kN == 16) WgmmaE4m3N16(d, desc_a, desc_b, scale_d);
  if constexpr (kN == 32) WgmmaE4m3N32(d, desc_a, desc_b, scale_d);
  if constexpr (kN == 64) WgmmaE4m3N64(d, desc_a, desc_b, scale_d);
  if constexpr (kN == 128) WgmmaE4m3N128(d, desc_a, desc_b, scale_d);
  if constexpr (kN == 256) WgmmaE4m3N256(d, desc_a, desc_b, scale_d);
}
// The first k-slice, overwriting d (d not live before it).
template <int kN>
__device__ __forceinline__ void WgmmaE4m3First(float (&d)[kN / 2], uint64_t desc_a, uint64_t desc_b) {
  static_assert(kN == 16 || kN == 32 || kN == 64 || kN == 128, "wgmma N (first slice)");
  if constexpr (kN == 16) WgmmaE4m3N16First(d, desc_a, desc_b);
  if constexpr (kN == 32) WgmmaE4m3N32First(d, desc_a, desc_b);
  if constexpr (kN == 64) WgmmaE4m3N64First(d, desc_a, desc_b);
  if constexpr (kN == 128) WgmmaE4m3N128First(d, desc_a, desc_b);
}
// e5m2 with A from registers: first slice (overwrites) or accumulate.
template <int kN>
__device__ __forceinline__ void WgmmaE5m2RegA(float (&d)[kN / 2], const uint32_t (&a)[4],
                                              uint64_t desc_b, bool first) {
  static_assert(kN == 16 || kN == 32 || kN == 64 || kN == 128, "wgmma N (e5m2, A in registers)");
  if constexpr (kN == 16) first ? WgmmaE5m2RegAN16First(d, a, desc_b) : WgmmaE5m2RegAN16(d, a, desc_b);
  if constexpr (kN == 32) first ? WgmmaE5m2RegAN32First(d, a, desc_b) : WgmmaE5m2RegAN32(d, a, desc_b);
  if constexpr (kN == 64) first ? WgmmaE5m2RegAN64First(d, a, desc_b) : WgmmaE5m2RegAN64(d, a, desc_b);
  if constexpr (kN == 128) first ? WgmmaE5m2RegAN128First(d, a, desc_b) : WgmmaE5m2RegAN128(d, a, desc_b);
}

// Barrier `id` over `threads` threads (as NamedBarrierSync) that also
// returns whether `pred` held in any of them.
__device__ __forceinline__ bool NamedBarrierOr(int id, int threads, bool pred) {
  uint32_t r;
  asm volatile(
      "{\n.reg .pred pi, po;\nsetp.ne.u32 pi, %1, 0;\n"
      "bar.red.or.pred po, %2, %3, pi;\nselp.u32 %0, 1, 0, po;\n}\n"
      : "=r"(r) : "r"(static_cast<uint32_t>(pred)), "r"(id), "r"(threads) : "memory");
  return r != 0;
}

// Indexer epilogue over a wgmma fp32 accumulator of kH heads per query row
// (row r holds the n8 column groups r * kH / 8 .. + kH / 8 - 1; lane quad t
// holds columns 2t, 2t+1 of each group): sum_h w[h] * ReLU(q_h . k) for the
// thread's two entries as (x + |x|) * w / 2 (halved weights), over the
// thread's own columns (the quad's four lanes then hold the row's four
// partial sums). acc: one row's 4 * kG values; wj(j): the thread's weight
// pair {w[8 j + 2 t], w[8 j + 2 t + 1]} of the row's column group j.
template <int kG, class W>
__device__ __forceinline__ float2 ReluWeightedPartials(const float* acc, W wj) {
  // Four FMA chains of kG (each entry's even and odd columns), not two of
  // 2 * kG: the chains are the epilogue's latency.
  float s0 = 0.f, s1 = 0.f, u0 = 0.f, u1 = 0.f;
#pragma unroll
  for (int j = 0; j < kG; ++j) {
    const float2 w = wj(j);
    s0 = fmaf(acc[4 * j] + fabsf(acc[4 * j]), w.x, s0);
    u0 = fmaf(acc[4 * j + 1] + fabsf(acc[4 * j + 1]), w.y, u0);
    s1 = fmaf(acc[4 * j + 2] + fabsf(acc[4 * j + 2]), w.x, s1);
    u1 = fmaf(acc[4 * j + 3] + fabsf(acc[4 * j + 3]), w.y, u1);
  }
  return make_float2(s0 + u0, s1 + u1);
}

// Partials (ReluWeightedPartials) reduced over the quad: every lane holds
// both entries' sums.
__device__ __forceinline__ float2 QuadSums(float2 s) {
  s.x += ShflXor(s.x, 1);
  s.x += ShflXor(s.x, 2);
  s.y += ShflXor(s.y, 1);
  s.y += ShflXor(s.y, 2);
  return s;
}

// The quad's sums of kR rows' partials p[r] = {entry e0, entry e0 + 8}
// (ReluWeightedPartials), transposed: at each shuffle a lane sends the half
// of its values its partner keeps and keeps the other half, so that lane t
// of the quad ends with whole sums of its own share only:
//   kR = 1: entry t & 1 (.x; lanes t and t ^ 2 alike);
//   kR = 2: row t >> 1, entry t & 1 (.x);
//   kR = 4: row t, both entries (.x: e0, .y: e0 + 8).
// At kR = 2: 3 shuffles, 3 adds and 6 selects, against 8 shuffles and 8
// adds for every sum in every lane (kR = 1: 2 + 2 + 2 against 4 + 4; kR = 4:
// 6 + 6 + 12 against 16 + 16). The four partials pair up differently than
// in QuadSums: a change within fp32 summation order (SPEC §5).
template <int kR>
__device__ __forceinline__ float2 QuadTransposedSums(const float2 (&p)[kR], int t) {
  static_assert(kR == 1 || kR == 2 || kR == 4, "one, two or four rows per warpgroup");
  const bool hi = (t & 2) != 0, odd = (t & 1) != 0;
  if constexpr (kR == 1) {
    float k = odd ? p[0].y : p[0].x;
    const float s = odd ? p[0].x : p[0].y;
    k += ShflXor(s, 1);
    k += ShflXor(k, 2);
    return make_float2(k, 0.f);
  } else if constexpr (kR == 2) {
    // xor 2: lanes t & 2 keep row 1, the others row 0; xor 1: t & 1 keeps e0 + 8.
    float ka = hi ? p[1].x : p[0].x, kb = hi ? p[1].y : p[0].y;
    const float sa = hi ? p[0].x : p[1].x, sb = hi ? p[0].y : p[1].y;
    ka += ShflXor(sa, 2);
    kb += ShflXor(sb, 2);
    const float k = odd ? kb : ka, s = odd ? ka : kb;
    return make_float2(k + ShflXor(s, 1), 0.f);
  } else {
    // xor 2: lanes t & 2 keep rows 2, 3; xor 1: t & 1 keeps the pair's second.
    float2 k0 = hi ? p[2] : p[0], k1 = hi ? p[3] : p[1];
    const float2 s0 = hi ? p[0] : p[2], s1 = hi ? p[1] : p[3];
    k0.x += ShflXor(s0.x, 2);
    k0.y += ShflXor(s0.y, 2);
    k1.x += ShflXor(s1.x, 2);
    k1.y += ShflXor(s1.y, 2);
    float2 k = odd ? k1 : k0;
    const float2 s = odd ? k0 : k1;
    k.x += ShflXor(s.x, 1);
    k.y += ShflXor(s.y, 1);
    return k;
  }
}

// Row r's partials (ReluWeightedPartials) with the halved weights in shared
// memory. acc: [4 * (kH / 8) * rows] per thread; w_s: [rows * kH].
template <int kH>
__device__ __forceinline__ float2 ReluWeightedHeadPartials(const float* acc, const float* w_s, int r, int t) {
  static_assert(kH % 8 == 0, "whole n8 column groups per row");
  constexpr int kG = kH / 8;
  return ReluWeightedPartials<kG>(acc + 4 * r * kG, [&](int j) {
    return *reinterpret_cast<const float2*>(w_s + (r * kG + j) * 8 + 2 * t);
  });
}

// Row r's sums, every lane of the quad holding both.
template <int kH>
__device__ __forceinline__ float2 ReluWeightedHeadSums(const float* acc, const float* w_s, int r, int t) {
  return QuadSums(ReluWeightedHeadPartials<kH>(acc, w_s, r, t));
}

// One row's partials with the thread's halved weight pairs in registers
// (w[j] for column group j).
template <int kH>
__device__ __forceinline__ float2 ReluWeightedHeadPartialsReg(const float* acc, const float2* w) {
  static_assert(kH % 8 == 0, "whole n8 column groups per row");
  return ReluWeightedPartials<kH / 8>(acc, [&](int j) { return w[j]; });
}

}  // namespace gpu
}  // namespace indexer
#endif  // INDEXER_GPU_WGMMA
