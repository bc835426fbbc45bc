// The dense-logits and block-score path choices (params.h: LaunchDenseLogits,
// LaunchBlockScorePath) and the pool's tensor map, the places where
// vendor-specific paths join the backend.
// They join through compat constants, never through an #if: the sm_90 paths
// of hopper/ are compiled into CUDA builds only (kHopperPaths), so a HIP
// build has no Hopper path at all rather than stubs that refuse.
#include "kernels/gpu/params.h"

#include "kernels/gpu/gather_logits.h"

#include <string_view>

namespace indexer {
namespace gpu {
namespace {

// Templates on the build's constant so that a build without the paths never
// instantiates the branch that names them (no reference to link).
template <bool kHopper>
bool TryHopperLogits(const LogitsParams& p, int cc_major, int cc_minor, Stream stream,
                     int max_path, const char** which, absl::Status* status) {
  if constexpr (kHopper) {
    if (max_path >= 2 && WgmmaMxfp4Enabled() && WgmmaMxfp4Supported(p, cc_major, cc_minor)) {
      *which = "wgmma_mxfp4";
      *status = LaunchDenseLogitsWgmmaMxfp4(p, stream);
      return true;
    }
    if (max_path >= 2 && WgmmaLogitsSupported(p, cc_major, cc_minor)) {
      if (WgmmaWsEnabled() && WgmmaWsSupported(p)) {
        *which = "wgmma_ws";
        *status = LaunchDenseLogitsWgmmaWs(p, stream);
        return true;
      }
      *which = "wgmma";
      *status = LaunchDenseLogitsWgmma(p, stream);
      return true;
    }
    if (max_path >= 1 && MmaLogitsSupported(p, cc_major, cc_minor)) {
      *which = "mma";
      *status = LaunchDenseLogitsMma(p, stream);
      return true;
    }
  }
  (void)p, (void)cc_major, (void)cc_minor, (void)stream, (void)max_path, (void)which,
      (void)status;
  return false;
}

// The gather walk: MXFP4 on its warp-specialized kernel (GatherLogitsSupported
// took the layout); FP8 on the warp-specialized kernel where it takes `p`,
// else the serial one (no tensor map: it copies entry by entry).
template <bool kHopper>
bool TryHopperGather(const LogitsParams& p, const TensorMap* rows8, Stream stream, const char** which,
                     absl::Status* status) {
  if constexpr (kHopper) {
    if (p.layout.format == KvFormat::kMxfp4) {
      *which = "wgmma_mxfp4_gather";
      *status = LaunchDenseLogitsWgmmaMxfp4Gather(p, stream);
      return true;
    }
    if (rows8 != nullptr && WgmmaWsEnabled() && WgmmaWsGatherSupported(p)) {
      *which = "wgmma_ws_gather";
      *status = LaunchDenseLogitsWgmmaWsGather(p, *rows8, stream);
      return true;
    }
    LogitsParams serial = p;
    serial.use_tma = false;
    *which = "wgmma_gather";
    *status = LaunchDenseLogitsWgmma(serial, stream);
    return true;
  }
  (void)p, (void)rows8, (void)stream, (void)which, (void)status;
  return false;
}

template <bool kHopper>
bool HopperGatherSupported(const LogitsParams& p, int cc_major, int cc_minor) {
  if constexpr (kHopper) {
    LogitsParams probe = p;
    probe.max_group_rows = 1;
    if (p.layout.format == KvFormat::kMxfp4) {
      return WgmmaMxfp4Enabled() && WgmmaMxfp4GatherSupported(probe, cc_major, cc_minor);
    }
    return p.layout.format == KvFormat::kFp8 && p.layout.fp8 == Fp8Variant::kE4m3fn &&
           WgmmaLogitsSupported(probe, cc_major, cc_minor);
  }
  (void)p, (void)cc_major, (void)cc_minor;
  return false;
}

template <bool kHopper>
bool HopperTensorMap(const PageLayout& layout, int cc_major) {
  if constexpr (kHopper) {
    return cc_major == 9 && WgmmaTmaSupported(layout);
  }
  (void)layout, (void)cc_major;
  return false;
}

template <bool kHopper>
bool HopperBlockTensorMap(const PageLayout& layout, int cc_major) {
  if constexpr (kHopper) {
    return cc_major == 9 && BlockScoresStreamTmaLayout(layout);
  }
  (void)layout, (void)cc_major;
  return false;
}

template <bool kHopper>
bool HopperFillsTopkHist(const LogitsParams& p, const char* which) {
  if constexpr (kHopper) {
    return which != nullptr && std::string_view(which) == "wgmma_ws" && WgmmaWsFillsTopkHist(p);
  }
  (void)p, (void)which;
  return false;
}


template <bool kHopper>
bool TryHopperBlock(const BlockScoreParams& p, const BlockWorkMap* wm, int cc_major, int cc_minor,
                    int32_t num_sms, Stream stream, int max_path, const char** which,
                    absl::Status* status) {
  if constexpr (kHopper) {
    if (max_path >= 2 && wm != nullptr && BlockScoresStreamSupported(p, cc_major, cc_minor)) {
      *which = "block_stream";
      *status = LaunchBlockScoresStream(p, *wm, stream);
      return true;
    }
    if (max_path >= 1 && BlockScoresMmaSupported(p, cc_major, cc_minor)) {
      *which = "block_mma";
      *status = LaunchBlockScoresMma(p, num_sms, stream);
      return true;
    }
  }
  (void)p, (void)wm, (void)cc_major, (void)cc_minor, (void)num_sms, (void)stream, (void)max_path,
      (void)which, (void)status;
  return false;
}

template <bool kHopper>
int32_t HopperBlockCtas(int cc_major, int32_t num_sms, int max_path) {
  if constexpr (kHopper) {
    if (max_path >= 2 && cc_major == 9) return BlockScoresStreamCtas(num_sms);
  }
  (void)cc_major, (void)num_sms, (void)max_path;
  return 0;
}

}  // namespace

int32_t BlockWorkMapCtas(int cc_major, int32_t num_sms, int max_path) {
  return HopperBlockCtas<kHopperPaths>(cc_major, num_sms, max_path);
}

absl::Status LaunchBlockScorePath(const BlockScoreParams& p, const BlockWorkMap* wm, int cc_major,
                                  int cc_minor, int32_t num_sms, Stream stream, int max_path,
                                  const char** which) {
  const char* unused;
  if (which == nullptr) which = &unused;
  absl::Status status;
  if (TryHopperBlock<kHopperPaths>(p, wm, cc_major, cc_minor, num_sms, stream, max_path, which,
                                   &status)) {
    return status;
  }
  *which = "block_portable";
  return LaunchBlockScores(p, stream);
}


bool LogitsFillTopkHist(const LogitsParams& p, const char* which) {
  return p.topk_hist != nullptr && HopperFillsTopkHist<kHopperPaths>(p, which);
}

absl::Status LaunchDenseLogits(const LogitsParams& p, int cc_major,
                               int cc_minor, Stream stream,
                               const char** which, int max_path) {
  const char* unused;
  if (which == nullptr) which = &unused;
  // The MFMA kernels (gfx942 / gfx950; on CUDA through the instruction
  // model when asked for: max_path 3 / 4 or INDEXER_GPU_MFMA_MODEL). Before
  // the e4m3fn gate below: gfx942 multiplies e4m3fnuz.
  if (const int arch = MfmaLogitsArch(p, cc_major, cc_minor, max_path); arch != 0) {
    *which = MfmaPathName(arch);
    return LaunchDenseLogitsMfma(p, arch, stream);
  }
  // An MFMA selection that its kernel does not take runs what that device
  // would: the portable kernel.
  if (max_path > 2) max_path = 0;
  absl::Status status;
  // The sm_90 tensor cores multiply e4m3fn: an e4m3fnuz cache takes the
  // portable kernel on NVIDIA devices.
  const bool fn_codes = p.layout.format != KvFormat::kFp8 || p.layout.fp8 == Fp8Variant::kE4m3fn;
  if (fn_codes &&
      TryHopperLogits<kHopperPaths>(p, cc_major, cc_minor, stream, max_path, which, &status)) {
    return status;
  }
  *which = "portable";
  return LaunchDenseLogitsPortable(p, stream);
}

bool GatherLogitsSupported(const LogitsParams& p, int cc_major, int cc_minor) {
  return HopperGatherSupported<kHopperPaths>(p, cc_major, cc_minor);
}

absl::Status LaunchGatherLogits(const LogitsParams& p, const TensorMap* rows8, int cc_major, int cc_minor,
                                Stream stream, const char** which) {
  const char* unused;
  if (which == nullptr) which = &unused;
  *which = "none";
  if (!GatherLogitsSupported(p, cc_major, cc_minor)) {
    return absl::FailedPreconditionError(
        "gather walk: expected FP8 e4m3fn K with D 128, or linear MXFP4 pages of a multiple of 64 entries "
        "with pool blocks of a multiple of 8 entries, and H 16, 32 or 64 on an sm_90a device");
  }
  absl::Status status;
  if (TryHopperGather<kHopperPaths>(p, rows8, stream, which, &status)) return status;
  return absl::FailedPreconditionError("gather walk: this build has no sm_90 kernels");
}

bool PoolWantsTensorMap(const PageLayout& layout, int cc_major) {
  return HopperTensorMap<kHopperPaths>(layout, cc_major);
}

bool BlockPoolWantsTensorMap(const PageLayout& layout, int cc_major) {
  return HopperBlockTensorMap<kHopperPaths>(layout, cc_major);
}

}  // namespace gpu
}  // namespace indexer
