// The only vendor seam of the gpu backend (SPEC §7): runtime calls, streams,
// events, errors, warp shuffles and the compile-time wave width. Everything
// else in kernels/gpu is one source for CUDA (sm_90) and HIP (gfx942/gfx950)
// and names no vendor.
//
// Build constants: kWarpSize (lanes of a warp / wavefront) and kHopperPaths
// (whether the sm_90 sources of kernels/gpu/hopper/ are in the build; name
// them only under `if constexpr (kHopperPaths)` inside a template).
//
// Feature macros, the only ones kernels may test:
//   INDEXER_GPU_HIP / INDEXER_GPU_CUDA   which runtime this build targets
//   INDEXER_GPU_WAVE64_MODEL             CUDA: kWarpSize 64, warp calls
//                                        modelled across two warps (set
//                                        per source by the build)
//   INDEXER_GPU_MMA_FP8                  1 in a device pass that has the
//                                        m16n8k32 e4m3 mma.sync (sm_89+)
//   INDEXER_GPU_WGMMA                    1 in an sm_90a device pass (wgmma,
//                                        cp.async, async-proxy fences)
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#if defined(__HIP_PLATFORM_AMD__) || defined(__HIP__) || defined(__HIPCC__)
#define INDEXER_GPU_HIP 1
#include <hip/hip_runtime.h>
#else
#define INDEXER_GPU_CUDA 1
#include <cuda.h>  // CUtensorMap (the driver is reached through the runtime)
#include <cuda_runtime.h>
#include <cudaTypedefs.h>
#endif

#if defined(INDEXER_GPU_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define INDEXER_GPU_MMA_FP8 1
#else
#define INDEXER_GPU_MMA_FP8 0
#endif
#if defined(INDEXER_GPU_CUDA) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define INDEXER_GPU_WGMMA 1
#else
#define INDEXER_GPU_WGMMA 0
#endif

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/gpu/amd/mfma_lanes.h"

namespace indexer {
namespace gpu {

// An opaque tensor-copy descriptor (CUtensorMap on CUDA), passed by value to
// kernels as part of a __grid_constant__ parameter.
struct alignas(64) TensorMap {
  uint64_t opaque[16];
};

#if defined(INDEXER_GPU_HIP)
#define INDEXER_GRID_CONSTANT
// A kernel's register cap (CUDA __maxnreg__); HIP sizes from launch bounds.
#define INDEXER_MAXNREG(n)
using Error = hipError_t;
using Stream = hipStream_t;
using Event = hipEvent_t;
using DeviceProp = hipDeviceProp_t;
inline constexpr Error kSuccess = hipSuccess;
// gfx9 (CDNA: gfx942, gfx950) runs 64-lane wavefronts; RDNA is not a target.
inline constexpr int kWarpSize = 64;
inline constexpr const char* kRuntimeName = "hip";
inline constexpr bool kRuntimeIsHip = true;
// No sm_90 paths: kernels/gpu/hopper/ is not part of a HIP build.
inline constexpr bool kHopperPaths = false;
inline const char* ErrorString(Error e) { return hipGetErrorString(e); }
inline Error GetLastError() { return hipGetLastError(); }
inline Error GetDeviceCount(int* n) { return hipGetDeviceCount(n); }
inline Error SetDevice(int d) { return hipSetDevice(d); }
inline Error GetDevice(int* d) { return hipGetDevice(d); }
inline Error GetDeviceProperties(DeviceProp* p, int d) {
  return hipGetDeviceProperties(p, d);
}
inline Error Malloc(void** p, size_t n) { return hipMalloc(p, n); }
inline Error MemGetInfo(size_t* free, size_t* total) { return hipMemGetInfo(free, total); }
inline Error Free(void* p) { return hipFree(p); }
inline Error HostMalloc(void** p, size_t n) {
  return hipHostMalloc(p, n, hipHostMallocDefault);
}
inline Error HostFree(void* p) { return hipHostFree(p); }
// Pinned host memory the device also addresses (`*dev`): kernels store into
// it, the host reads it after the stream's wait, no copy enqueued.
inline Error HostMallocMapped(void** p, void** dev, size_t n) {
  const Error e = hipHostMalloc(p, n, hipHostMallocMapped);
  return e != hipSuccess ? e : hipHostGetDevicePointer(dev, *p, 0);
}
inline Error MemsetAsync(void* p, int v, size_t n, Stream s) {
  return hipMemsetAsync(p, v, n, s);
}
inline Error CopyH2D(void* d, const void* h, size_t n, Stream s) {
  return hipMemcpyAsync(d, h, n, hipMemcpyHostToDevice, s);
}
inline Error CopyD2H(void* h, const void* d, size_t n, Stream s) {
  return hipMemcpyAsync(h, d, n, hipMemcpyDeviceToHost, s);
}
inline Error CopyD2D(void* d, const void* src, size_t n, Stream s) {
  return hipMemcpyAsync(d, src, n, hipMemcpyDeviceToDevice, s);
}
inline Error StreamCreate(Stream* s) {
  return hipStreamCreateWithFlags(s, hipStreamNonBlocking);
}
inline Error StreamDestroy(Stream s) { return hipStreamDestroy(s); }
inline Error StreamSynchronize(Stream s) { return hipStreamSynchronize(s); }
inline Error EventCreate(Event* e) { return hipEventCreate(e); }
inline Error EventDestroy(Event e) { return hipEventDestroy(e); }
inline Error EventRecord(Event e, Stream s) { return hipEventRecord(e, s); }
inline Error EventSynchronize(Event e) { return hipEventSynchronize(e); }
inline Error EventElapsedMs(float* ms, Event a, Event b) {
  return hipEventElapsedTime(ms, a, b);
}
template <class Kernel>
inline Error SetMaxDynamicSmem(Kernel k, int bytes) {
  return hipFuncSetAttribute(reinterpret_cast<const void*>(k),
                             hipFuncAttributeMaxDynamicSharedMemorySize,
                             bytes);
}
template <class Kernel>
inline Error MaxActiveBlocksPerSm(int* n, Kernel k, int threads, size_t smem) {
  return hipOccupancyMaxActiveBlocksPerMultiprocessor(
      n, reinterpret_cast<const void*>(k), threads, smem);
}
// Inter-process memory (device regions of the data plane).
using IpcMemHandle = hipIpcMemHandle_t;
inline Error IpcGetMemHandle(IpcMemHandle* h, void* p) { return hipIpcGetMemHandle(h, p); }
inline Error IpcOpenMemHandle(void** p, const IpcMemHandle& h) {
  return hipIpcOpenMemHandle(p, h, hipIpcMemLazyEnablePeerAccess);
}
inline Error IpcCloseMemHandle(void* p) { return hipIpcCloseMemHandle(p); }
// The allocation holding device pointer `p`: its base and byte size.
inline Error MemAddressRange(void** base, size_t* bytes, void* p) {
  hipDeviceptr_t b = nullptr;
  const Error e = hipMemGetAddressRange(&b, bytes, static_cast<hipDeviceptr_t>(p));
  if (e == hipSuccess) *base = b;
  return e;
}
// The device's 16 UUID bytes.
inline Error DeviceUuid(unsigned char (&out)[16], int d) {
  hipUUID u;
  const Error e = hipDeviceGetUuid(&u, d);
  if (e == hipSuccess) for (int i = 0; i < 16; ++i) out[i] = static_cast<unsigned char>(u.bytes[i]);
  return e;
}
inline Error DevicePciBusId(char* buf, int len, int d) { return hipDeviceGetPCIBusId(buf, len, d); }
inline Error DeviceCanAccessPeer(int* can, int d, int peer) {
  return hipDeviceCanAccessPeer(can, d, peer);
}
// From the current device to `peer`; "already enabled" is success.
inline Error DeviceEnablePeerAccess(int peer) {
  const Error e = hipDeviceEnablePeerAccess(peer, 0);
  if (e == hipErrorPeerAccessAlreadyEnabled) {
    (void)hipGetLastError();
    return hipSuccess;
  }
  return e;
}
// Errors after which the context is unusable (device lost).
inline bool IsSticky(Error e) {
  return e == hipErrorIllegalAddress || e == hipErrorLaunchFailure ||
         e == hipErrorECCNotCorrectable || e == hipErrorAssert;
}
#else
#define INDEXER_GRID_CONSTANT __grid_constant__
#define INDEXER_MAXNREG(n) __maxnreg__(n)
using Error = cudaError_t;
using Stream = cudaStream_t;
using Event = cudaEvent_t;
using DeviceProp = cudaDeviceProp;
inline constexpr Error kSuccess = cudaSuccess;
#if defined(INDEXER_GPU_WAVE64_MODEL)
// The wave64 model (CUDA, the portable kernels only; CMake option
// INDEXER_GPU_WAVE64_MODEL): "warps" of 64 threads, as on gfx9, each two
// hardware warps whose shuffles, ballots and syncs below go through shared
// memory. Runs the portable kernels on an NVIDIA GPU as a wave64 device
// would schedule their lanes (tests of their wave-width independence).
inline constexpr int kWarpSize = 64;
#else
inline constexpr int kWarpSize = 32;
#endif
inline constexpr const char* kRuntimeName = "cuda";
inline constexpr bool kRuntimeIsHip = false;
// The sm_90 paths of kernels/gpu/hopper/ (mma.sync FP8, wgmma, bulk copies)
// are compiled in; each still checks the device it runs on.
inline constexpr bool kHopperPaths = true;
inline const char* ErrorString(Error e) { return cudaGetErrorString(e); }
inline Error GetLastError() { return cudaGetLastError(); }
inline Error GetDeviceCount(int* n) { return cudaGetDeviceCount(n); }
inline Error SetDevice(int d) { return cudaSetDevice(d); }
inline Error GetDevice(int* d) { return cudaGetDevice(d); }
inline Error GetDeviceProperties(DeviceProp* p, int d) {
  return cudaGetDeviceProperties(p, d);
}
inline Error Malloc(void** p, size_t n) { return cudaMalloc(p, n); }
inline Error MemGetInfo(size_t* free, size_t* total) { return cudaMemGetInfo(free, total); }
inline Error Free(void* p) { return cudaFree(p); }
inline Error HostMalloc(void** p, size_t n) { return cudaMallocHost(p, n); }
inline Error HostFree(void* p) { return cudaFreeHost(p); }
// Pinned host memory the device also addresses (`*dev`): kernels store into
// it, the host reads it after the stream's wait, no copy enqueued.
inline Error HostMallocMapped(void** p, void** dev, size_t n) {
  const Error e = cudaHostAlloc(p, n, cudaHostAllocMapped);
  return e != cudaSuccess ? e : cudaHostGetDevicePointer(dev, *p, 0);
}
inline Error MemsetAsync(void* p, int v, size_t n, Stream s) {
  return cudaMemsetAsync(p, v, n, s);
}
inline Error CopyH2D(void* d, const void* h, size_t n, Stream s) {
  return cudaMemcpyAsync(d, h, n, cudaMemcpyHostToDevice, s);
}
inline Error CopyD2H(void* h, const void* d, size_t n, Stream s) {
  return cudaMemcpyAsync(h, d, n, cudaMemcpyDeviceToHost, s);
}
inline Error CopyD2D(void* d, const void* src, size_t n, Stream s) {
  return cudaMemcpyAsync(d, src, n, cudaMemcpyDeviceToDevice, s);
}
inline Error StreamCreate(Stream* s) {
  return cudaStreamCreateWithFlags(s, cudaStreamNonBlocking);
}
inline Error StreamDestroy(Stream s) { return cudaStreamDestroy(s); }
inline Error StreamSynchronize(Stream s) { return cudaStreamSynchronize(s); }
inline Error EventCreate(Event* e) { return cudaEventCreate(e); }
inline Error EventDestroy(Event e) { return cudaEventDestroy(e); }
inline Error EventRecord(Event e, Stream s) { return cudaEventRecord(e, s); }
inline Error EventSynchronize(Event e) { return cudaEventSynchronize(e); }
inline Error EventElapsedMs(float* ms, Event a, Event b) {
  return cudaEventElapsedTime(ms, a, b);
}
template <class Kernel>
inline Error SetMaxDynamicSmem(Kernel k, int bytes) {
  return cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              bytes);
}
template <class Kernel>
inline Error MaxActiveBlocksPerSm(int* n, Kernel k, int threads, size_t smem) {
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(n, k, threads, smem);
}
// Inter-process memory (device regions of the data plane).
using IpcMemHandle = cudaIpcMemHandle_t;
inline Error IpcGetMemHandle(IpcMemHandle* h, void* p) { return cudaIpcGetMemHandle(h, p); }
inline Error IpcOpenMemHandle(void** p, const IpcMemHandle& h) {
  return cudaIpcOpenMemHandle(p, h, cudaIpcMemLazyEnablePeerAccess);
}
inline Error IpcCloseMemHandle(void* p) { return cudaIpcCloseMemHandle(p); }
// The allocation holding device pointer `p`: its base and byte size. The
// runtime API has no such call; the driver's cuMemGetAddressRange is
// fetched through the runtime (no link against libcuda, which machines
// without a driver lack). cudaErrorNotSupported when the driver lacks it.
inline Error MemAddressRange(void** base, size_t* bytes, void* p) {
  using Fn = int (*)(unsigned long long*, size_t*, unsigned long long);
  static const Fn fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &f, 12000, cudaEnableDefault, &q) !=
            cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      return static_cast<Fn>(nullptr);
    }
    return reinterpret_cast<Fn>(f);
  }();
  if (fn == nullptr) return cudaErrorNotSupported;
  unsigned long long b = 0;
  if (fn(&b, bytes, reinterpret_cast<unsigned long long>(p)) != 0) return cudaErrorInvalidValue;
  *base = reinterpret_cast<void*>(b);
  return cudaSuccess;
}
// The device's 16 UUID bytes.
inline Error DeviceUuid(unsigned char (&out)[16], int d) {
  cudaDeviceProp p;
  const Error e = cudaGetDeviceProperties(&p, d);
  if (e == cudaSuccess) for (int i = 0; i < 16; ++i) out[i] = static_cast<unsigned char>(p.uuid.bytes[i]);
  return e;
}
inline Error DevicePciBusId(char* buf, int len, int d) { return cudaDeviceGetPCIBusId(buf, len, d); }
inline Error DeviceCanAccessPeer(int* can, int d, int peer) {
  return cudaDeviceCanAccessPeer(can, d, peer);
}
// From the current device to `peer`; "already enabled" is success.
inline Error DeviceEnablePeerAccess(int peer) {
  const Error e = cudaDeviceEnablePeerAccess(peer, 0);
  if (e == cudaErrorPeerAccessAlreadyEnabled) {
    (void)cudaGetLastError();
    return cudaSuccess;
  }
  return e;
}
inline bool IsSticky(Error e) {
  return e == cudaErrorIllegalAddress || e == cudaErrorLaunchFailure ||
         e == cudaErrorIllegalInstruction || e == cudaErrorMisalignedAddress ||
         e == cudaErrorHardwareStackError || e == cudaErrorAssert ||
         e == cudaErrorECCUncorrectable;
}
#endif

// The device's UUID as nvidia-smi -L prints it, "GPU-xxxxxxxx-xxxx-xxxx-
// xxxx-xxxxxxxxxxxx" (DeviceRegion.device_uuid).
inline Error DeviceUuidString(std::string* out, int d) {
  unsigned char b[16];
  const Error e = DeviceUuid(b, d);
  if (e != kSuccess) return e;
  static const char kHex[] = "0123456789abcdef";
  out->assign("GPU-");
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out->push_back('-');
    out->push_back(kHex[b[i] >> 4]);
    out->push_back(kHex[b[i] & 15]);
  }
  return kSuccess;
}

// The status of a failed GPU call: the call text and where it was made. A
// sticky error means the device is lost for this process: UNAVAILABLE, so
// the server turns NOT_SERVING (SPEC §9).
inline absl::Status ErrorStatus(Error e, const char* what, const char* file,
                                int line) {
  std::string msg = absl::StrCat(kRuntimeName, " error ", static_cast<int>(e),
                                 " (", ErrorString(e), ") in `", what, "` at ",
                                 file, ":", line);
  if (IsSticky(e)) return absl::UnavailableError(std::move(msg));
  return absl::InternalError(std::move(msg));
}

// A 3-D uint8 tensor map over `base` for the bulk tensor copy engine:
// dims[0] contiguous, strides[i] the byte stride of dim i + 1, boxes of
// `box` elements landing in shared memory in the swizzle of `swizzle_bytes`:
// 128 (16-byte chunk bits 4..6 of the shared address XOR bits 7..9) or 64
// (bits 4..5 XOR bits 7..8). UNIMPLEMENTED where the runtime has no such
// engine (HIP).
inline absl::Status EncodeTensorMapU8(TensorMap* out, const void* base, const uint64_t (&dims)[3],
                                      const uint64_t (&strides)[2], const uint32_t (&box)[3],
                                      int swizzle_bytes) {
#if defined(INDEXER_GPU_HIP)
  (void)out, (void)base, (void)dims, (void)strides, (void)box, (void)swizzle_bytes;
  return absl::UnimplementedError("tensor maps: no bulk tensor copies on hip");
#else
  static_assert(sizeof(TensorMap) == sizeof(CUtensorMap), "opaque size");
  if (swizzle_bytes != 128 && swizzle_bytes != 64) {
    return absl::InvalidArgumentError(absl::StrCat("tensor map: swizzle of ", swizzle_bytes,
                                                   " bytes; expected 64 or 128"));
  }
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found;
  const Error e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                                   cudaEnableDefault, &found);
  if (e != kSuccess || found != cudaDriverEntryPointSuccess || fn == nullptr) {
    return absl::UnavailableError("cuTensorMapEncodeTiled: not found in the driver");
  }
  const cuuint32_t elem[3] = {1, 1, 1};
  const CUresult r = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn)(
      reinterpret_cast<CUtensorMap*>(out), CU_TENSOR_MAP_DATA_TYPE_UINT8, 3,
      const_cast<void*>(base), dims, strides, box, elem,
      CU_TENSOR_MAP_INTERLEAVE_NONE,
      swizzle_bytes == 64 ? CU_TENSOR_MAP_SWIZZLE_64B : CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    return absl::InternalError(absl::StrCat("cuTensorMapEncodeTiled failed: ", static_cast<int>(r)));
  }
  return absl::OkStatus();
#endif
}

// ---- device side: lanes and shuffles ------------------------------------
#if defined(__CUDACC__) || defined(__HIPCC__) || defined(__HIP__)
__device__ __forceinline__ int LaneId() {
  return static_cast<int>(threadIdx.x) % kWarpSize;
}
__device__ __forceinline__ int WarpId() {
  return static_cast<int>(threadIdx.x) / kWarpSize;
}
#if defined(INDEXER_GPU_WAVE64_MODEL)
// Threads per block the wave64 model covers (blocks are whole 64-thread
// "warps"; named barrier 1 + warp, so at most 15 of them).
inline constexpr int kWave64ModelThreads = 512;
__device__ __forceinline__ uint64_t* Wave64Exchange() {
  __shared__ uint64_t x[kWave64ModelThreads];
  return x;
}
// All 64 threads of this thread's "warp" meet; shared-memory writes before
// are visible after.
__device__ __forceinline__ void Wave64Barrier() {
  asm volatile("bar.sync %0, %1;" ::"r"(1 + static_cast<int>(threadIdx.x) / 64), "r"(64) : "memory");
}
// v of lane `src` (0..63) of this thread's "warp".
template <class T>
__device__ __forceinline__ T Wave64Read(T v, int src) {
  static_assert(sizeof(T) <= 8, "up to 8-byte lanes");
  uint64_t* x = Wave64Exchange();
  uint64_t bits = 0;
  memcpy(&bits, &v, sizeof(T));
  x[threadIdx.x] = bits;
  Wave64Barrier();
  const uint64_t got = x[(threadIdx.x & ~63u) + src];
  Wave64Barrier();
  T r;
  memcpy(&r, &got, sizeof(T));
  return r;
}
#endif
template <class T>
__device__ __forceinline__ T ShflXor(T v, int mask) {
#if defined(INDEXER_GPU_HIP)
  return __shfl_xor(v, mask, kWarpSize);
#elif defined(INDEXER_GPU_WAVE64_MODEL)
  return Wave64Read(v, LaneId() ^ mask);
#else
  return __shfl_xor_sync(0xffffffffu, v, mask, kWarpSize);
#endif
}
template <class T>
__device__ __forceinline__ T ShflDown(T v, int delta) {
#if defined(INDEXER_GPU_HIP)
  return __shfl_down(v, delta, kWarpSize);
#elif defined(INDEXER_GPU_WAVE64_MODEL)
  return Wave64Read(v, LaneId() + delta < kWarpSize ? LaneId() + delta : LaneId());  // HIP's rule
#else
  return __shfl_down_sync(0xffffffffu, v, delta, kWarpSize);
#endif
}
template <class T>
__device__ __forceinline__ T ShflIdx(T v, int lane) {
#if defined(INDEXER_GPU_HIP)
  return __shfl(v, lane, kWarpSize);
#elif defined(INDEXER_GPU_WAVE64_MODEL)
  return Wave64Read(v, lane & (kWarpSize - 1));
#else
  return __shfl_sync(0xffffffffu, v, lane, kWarpSize);
#endif
}
// Lanes of the warp whose `pred` is set, as a 64-bit mask (bit i = lane i).
__device__ __forceinline__ uint64_t Ballot(bool pred) {
#if defined(INDEXER_GPU_HIP)
  return static_cast<uint64_t>(__ballot(pred));
#elif defined(INDEXER_GPU_WAVE64_MODEL)
  // Each half's 32-bit ballot, exchanged.
  const uint64_t half = __ballot_sync(0xffffffffu, pred);
  const uint64_t other = Wave64Read(half, LaneId() ^ 32);
  return LaneId() < 32 ? (half | other << 32) : (other | half << 32);
#else
  return static_cast<uint64_t>(__ballot_sync(0xffffffffu, pred));
#endif
}
// A global load that bypasses the incoherent L1 (data other blocks wrote
// during this launch, published through a fence and an atomic).
template <class T>
__device__ __forceinline__ T LoadCg(const T* p) {
#if defined(INDEXER_GPU_HIP)
  return *static_cast<const volatile T*>(p);
#else
  return __ldcg(p);
#endif
}
__device__ __forceinline__ int PopCount64(uint64_t v) { return __popcll(v); }
// Programmatic dependent launch (sm_90): a kernel launched with
// GPU_LAUNCH_AFTER_PREVIOUS may start while the kernel before it on the
// stream still runs, once that kernel's blocks have all started or called
// AllowDependentLaunch(); it must call GridDependencyWait() before it reads
// what that kernel wrote. Elsewhere both are no-ops and the launch is plain.
__device__ __forceinline__ void GridDependencyWait() {
#if defined(INDEXER_GPU_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void AllowDependentLaunch() {
#if defined(INDEXER_GPU_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
// Makes this warp's shared-memory writes visible to its own lanes' later
// reads (lanes exchange data through shared memory).
__device__ __forceinline__ void WarpSync() {
#if defined(INDEXER_GPU_HIP)
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "wavefront");
  __builtin_amdgcn_wave_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "wavefront");
#elif defined(INDEXER_GPU_WAVE64_MODEL)
  Wave64Barrier();
#else
  __syncwarp();
#endif
}
// Mask of the lanes below this one.
__device__ __forceinline__ uint64_t LanesBelow() {
  const int lane = LaneId();
  return lane == 0 ? 0 : (~uint64_t{0} >> (64 - lane));
}

// ---- wave64: the MFMA kernels (kernels/gpu/amd/) -------------------------
// The MFMA kernels are written against 64-lane waves: a block is whole waves,
// wave w = threads [64w, 64w + 64). On HIP (gfx9) a wave is the hardware
// wavefront and each Mfma* call below is the instruction's builtin. On CUDA
// a wave runs as two warps and each Mfma* call is the exact model of the
// instruction in kernels/gpu/amd/mfma_model.h: same operand fragments in the
// same lanes, accumulator fragments returned in the documented lanes
// (kernels/gpu/amd/mfma_lanes.h cites the ISA tables). Everything that
// crosses the two warps goes through the wave's WaveScratch (shared memory)
// under a named barrier of the wave's 64 threads. Every lane of a wave must
// make the same Wave*/Mfma* calls (as on the hardware, which runs them
// wave-wide).
inline constexpr int kWaveSize = 64;
__device__ __forceinline__ int WaveLane() { return static_cast<int>(threadIdx.x) % kWaveSize; }
__device__ __forceinline__ int WaveIndex() { return static_cast<int>(threadIdx.x) / kWaveSize; }
struct MfmaAcc16 {  // the 16 accumulator GPRs of a 32x32 MFMA
  float v[16];
};
struct MfmaAcc4 {  // the 4 accumulator GPRs of a 16x16 MFMA
  float v[4];
};
#if defined(INDEXER_GPU_HIP)
struct WaveScratch {  // the hardware exchanges lanes itself
  int unused;
};
// The FP8 variant this device pass's matrix cores read (gfx942: e4m3fnuz;
// gfx950: OCP e4m3).
#if defined(__gfx942__)
inline constexpr mfma::Fp8Kind kNativeFp8Kind = mfma::Fp8Kind::kFnuz;
#else
inline constexpr mfma::Fp8Kind kNativeFp8Kind = mfma::Fp8Kind::kFn;
#endif
// Orders the wave's shared-memory writes before its lanes' later reads.
__device__ __forceinline__ void WaveSync(WaveScratch*) { WarpSync(); }
__device__ __forceinline__ float WaveShflXor(float v, int mask, WaveScratch*) {
  return __shfl_xor(v, mask, kWaveSize);
}
using MfmaV16f = float __attribute__((ext_vector_type(16)));
using MfmaV4f = float __attribute__((ext_vector_type(4)));
using MfmaV8i = int __attribute__((ext_vector_type(8)));
// v_mfma_f32_32x32x16_fp8_fp8 (acc += A * B). kKind must be the device's
// variant: a kernel instantiated for the other one traps.
template <mfma::Fp8Kind kKind>
__device__ __forceinline__ void MfmaFp8x32x32x16(uint64_t a, uint64_t b, MfmaAcc16& acc, WaveScratch*) {
  if constexpr (kKind == kNativeFp8Kind) {
    MfmaV16f c;
    for (int i = 0; i < 16; ++i) c[i] = acc.v[i];
    c = __builtin_amdgcn_mfma_f32_32x32x16_fp8_fp8(static_cast<long>(a), static_cast<long>(b), c, 0, 0, 0);
    for (int i = 0; i < 16; ++i) acc.v[i] = c[i];
  } else {
    __builtin_trap();
  }
}
// v_mfma_f32_16x16x32_fp8_fp8.
template <mfma::Fp8Kind kKind>
__device__ __forceinline__ void MfmaFp8x16x16x32(uint64_t a, uint64_t b, MfmaAcc4& acc, WaveScratch*) {
  if constexpr (kKind == kNativeFp8Kind) {
    MfmaV4f c;
    for (int i = 0; i < 4; ++i) c[i] = acc.v[i];
    c = __builtin_amdgcn_mfma_f32_16x16x32_fp8_fp8(static_cast<long>(a), static_cast<long>(b), c, 0, 0, 0);
    for (int i = 0; i < 4; ++i) acc.v[i] = c[i];
  } else {
    __builtin_trap();
  }
}
// v_mfma_scale_f32_32x32x64_f8f6f4 with FP4 (e2m1) A and B (cbsz = blgp =
// 4): 32 nibbles per lane in a[0..3], the lane's E8M0 scale in byte 0 of
// sa / sb (op_sel 0). gfx950 only: elsewhere (and where the compiler does
// not know gfx950) it traps, and the launcher never selects it.
__device__ __forceinline__ void MfmaScaleFp4x32x32x64(const uint32_t (&a)[4], const uint32_t (&b)[4], uint32_t sa,
                                                      uint32_t sb, MfmaAcc16& acc, WaveScratch*) {
#if defined(__gfx950__)
  MfmaV8i av = {static_cast<int>(a[0]), static_cast<int>(a[1]), static_cast<int>(a[2]), static_cast<int>(a[3]), 0, 0, 0, 0};
  MfmaV8i bv = {static_cast<int>(b[0]), static_cast<int>(b[1]), static_cast<int>(b[2]), static_cast<int>(b[3]), 0, 0, 0, 0};
  MfmaV16f c;
  for (int i = 0; i < 16; ++i) c[i] = acc.v[i];
  c = __builtin_amdgcn_mfma_scale_f32_32x32x64_f8f6f4(av, bv, c, 4, 4, 0, static_cast<int>(sa), 0, static_cast<int>(sb));
  for (int i = 0; i < 16; ++i) acc.v[i] = c[i];
#else
  (void)a, (void)b, (void)sa, (void)sb, (void)acc;
  __builtin_trap();
#endif
}
// v_mfma_scale_f32_16x16x128_f8f6f4 with FP4 A and B.
__device__ __forceinline__ void MfmaScaleFp4x16x16x128(const uint32_t (&a)[4], const uint32_t (&b)[4], uint32_t sa,
                                                       uint32_t sb, MfmaAcc4& acc, WaveScratch*) {
#if defined(__gfx950__)
  MfmaV8i av = {static_cast<int>(a[0]), static_cast<int>(a[1]), static_cast<int>(a[2]), static_cast<int>(a[3]), 0, 0, 0, 0};
  MfmaV8i bv = {static_cast<int>(b[0]), static_cast<int>(b[1]), static_cast<int>(b[2]), static_cast<int>(b[3]), 0, 0, 0, 0};
  MfmaV4f c;
  for (int i = 0; i < 4; ++i) c[i] = acc.v[i];
  c = __builtin_amdgcn_mfma_scale_f32_16x16x128_f8f6f4(av, bv, c, 4, 4, 0, static_cast<int>(sa), 0, static_cast<int>(sb));
  for (int i = 0; i < 4; ++i) acc.v[i] = c[i];
#else
  (void)a, (void)b, (void)sa, (void)sb, (void)acc;
  __builtin_trap();
#endif
}
// True where Mfma* run on matrix cores (HIP), false where they are the model.
inline constexpr bool kMfmaNative = true;
#else
inline constexpr bool kMfmaNative = false;
#endif
#endif  // device compiler

}  // namespace gpu
}  // namespace indexer

// The CUDA instruction model of the Mfma* calls above (CUDA device code only).
#if defined(INDEXER_GPU_CUDA) && defined(__CUDACC__)
#include "kernels/gpu/amd/mfma_model.h"
#endif

// Checks one GPU runtime call; returns its status from the enclosing
// function (absl::Status or StatusOr) with the call text and file:line.
#define GPU_RETURN_IF_ERROR(expr)                                          \
  do {                                                                     \
    const ::indexer::gpu::Error _gpu_err = (expr);                         \
    if (_gpu_err != ::indexer::gpu::kSuccess) {                            \
      return ::indexer::gpu::ErrorStatus(_gpu_err, #expr, __FILE__,        \
                                         __LINE__);                        \
    }                                                                      \
  } while (0)

// GPU_LAUNCH with programmatic dependent launch allowed (see
// GridDependencyWait); a plain GPU_LAUNCH on HIP.
#if defined(INDEXER_GPU_HIP)
#define GPU_LAUNCH_AFTER_PREVIOUS(kernel, grid, block, smem, stream, ...) \
  GPU_LAUNCH(kernel, grid, block, smem, stream, __VA_ARGS__)
#else
#define GPU_LAUNCH_AFTER_PREVIOUS(kernel, grid, block, smem, stream, ...)  \
  do {                                                                     \
    cudaLaunchConfig_t _cfg = {};                                          \
    _cfg.gridDim = (grid);                                                 \
    _cfg.blockDim = (block);                                               \
    _cfg.dynamicSmemBytes = (smem);                                        \
    _cfg.stream = (stream);                                                \
    cudaLaunchAttribute _attr[1];                                          \
    _attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;      \
    _attr[0].val.programmaticStreamSerializationAllowed = 1;               \
    _cfg.attrs = _attr;                                                    \
    _cfg.numAttrs = 1;                                                     \
    const ::indexer::gpu::Error _gpu_err =                                 \
        cudaLaunchKernelEx(&_cfg, kernel, __VA_ARGS__);                    \
    if (_gpu_err != ::indexer::gpu::kSuccess) {                            \
      return ::indexer::gpu::ErrorStatus(_gpu_err, "launch " #kernel,      \
                                         __FILE__, __LINE__);              \
    }                                                                      \
  } while (0)
#endif

// Launches `kernel<<<grid, block, smem, stream>>>(args...)` and checks the
// launch; the error names the kernel and the call site.
#define GPU_LAUNCH(kernel, grid, block, smem, stream, ...)                 \
  do {                                                                     \
    kernel<<<(grid), (block), (smem), (stream)>>>(__VA_ARGS__);            \
    const ::indexer::gpu::Error _gpu_err = ::indexer::gpu::GetLastError(); \
    if (_gpu_err != ::indexer::gpu::kSuccess) {                            \
      return ::indexer::gpu::ErrorStatus(_gpu_err, "launch " #kernel,      \
                                         __FILE__, __LINE__);              \
    }                                                                      \
  } while (0)
