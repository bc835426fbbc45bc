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
//   INDEXER_GPU_MMA_FP8                  1 in a device pass that has the
//                                        m16n8k32 e4m3 mma.sync (sm_89+)
//   INDEXER_GPU_WGMMA                    1 in an sm_90a device pass (wgmma,
//                                        cp.async, async-proxy fences)
#pragma once

#include <cstdint>
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
// No sm_90 paths: kernels/gpu/hopper/ is not part of a HIP build.
inline constexpr bool kHopperPaths = false;
inline const char* ErrorString(Error e) { return hipGetErrorString(e); }
inline Error GetLastError() { return hipGetLastError(); }
inline Error GetDeviceCount(int* n) { return hipGetDeviceCount(n); }
inline Error SetDevice(int d) { return hipSetDevice(d); }
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
inline constexpr int kWarpSize = 32;
inline constexpr const char* kRuntimeName = "cuda";
// The sm_90 paths of kernels/gpu/hopper/ (mma.sync FP8, wgmma, bulk copies)
// are compiled in; each still checks the device it runs on.
inline constexpr bool kHopperPaths = true;
inline const char* ErrorString(Error e) { return cudaGetErrorString(e); }
inline Error GetLastError() { return cudaGetLastError(); }
inline Error GetDeviceCount(int* n) { return cudaGetDeviceCount(n); }
inline Error SetDevice(int d) { return cudaSetDevice(d); }
inline Error GetDeviceProperties(DeviceProp* p, int d) {
  return cudaGetDeviceProperties(p, d);
}
inline Error Malloc(void** p, size_t n) { return cudaMalloc(p, n); }
inline Error MemGetInfo(size_t* free, size_t* total) { return cudaMemGetInfo(free, total); }
inline Error Free(void* p) { return cudaFree(p); }
inline Error HostMalloc(void** p, size_t n) { return cudaMallocHost(p, n); }
inline Error HostFree(void* p) { return cudaFreeHost(p); }
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
// `box` elements landing in shared memory in the 128-byte swizzle.
// UNIMPLEMENTED where the runtime has no such engine (HIP).
inline absl::Status EncodeTensorMapU8Sw128(TensorMap* out, const void* base,
                                           const uint64_t (&dims)[3],
                                           const uint64_t (&strides)[2],
                                           const uint32_t (&box)[3]) {
#if defined(INDEXER_GPU_HIP)
  (void)out, (void)base, (void)dims, (void)strides, (void)box;
  return absl::UnimplementedError("tensor maps: no bulk tensor copies on hip");
#else
  static_assert(sizeof(TensorMap) == sizeof(CUtensorMap), "opaque size");
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
      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
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
template <class T>
__device__ __forceinline__ T ShflXor(T v, int mask) {
#if defined(INDEXER_GPU_HIP)
  return __shfl_xor(v, mask, kWarpSize);
#else
  return __shfl_xor_sync(0xffffffffu, v, mask, kWarpSize);
#endif
}
template <class T>
__device__ __forceinline__ T ShflDown(T v, int delta) {
#if defined(INDEXER_GPU_HIP)
  return __shfl_down(v, delta, kWarpSize);
#else
  return __shfl_down_sync(0xffffffffu, v, delta, kWarpSize);
#endif
}
template <class T>
__device__ __forceinline__ T ShflIdx(T v, int lane) {
#if defined(INDEXER_GPU_HIP)
  return __shfl(v, lane, kWarpSize);
#else
  return __shfl_sync(0xffffffffu, v, lane, kWarpSize);
#endif
}
// Lanes of the warp whose `pred` is set, as a 64-bit mask (bit i = lane i).
__device__ __forceinline__ uint64_t Ballot(bool pred) {
#if defined(INDEXER_GPU_HIP)
  return static_cast<uint64_t>(__ballot(pred));
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
#else
  __syncwarp();
#endif
}
// Mask of the lanes below this one.
__device__ __forceinline__ uint64_t LanesBelow() {
  const int lane = LaneId();
  return lane == 0 ? 0 : (~uint64_t{0} >> (64 - lane));
}
#endif  // device compiler

}  // namespace gpu
}  // namespace indexer

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
