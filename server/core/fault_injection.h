// TEST-ONLY fault injection (SPEC §9 "a sticky device error turns the
// daemon NOT_SERVING and exits non-zero", tested on the cpu backend): a
// backend that forwards every call to another and, after a given number of
// layers, fails every layer, write and read with UNAVAILABLE as a sticky
// device error does (kernels/gpu/gpu_compat.h ErrorStatus). indexerd wraps
// its backend in one only when the environment variable
// INDEXERD_TEST_DEVICE_FAULT_AFTER_LAYERS is set (main.cc); never in
// production.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "kernels/backend.h"

namespace indexer {

// The environment variable naming the layer count (test-only).
inline constexpr char kDeviceFaultEnv[] = "INDEXERD_TEST_DEVICE_FAULT_AFTER_LAYERS";

// Wraps `inner`: layers 1..`ok_layers` run normally, every later RunLayer
// (and from then on every WriteEntries and ReadEntries) fails. Thread-safe
// as `inner` is.
std::unique_ptr<Backend> MakeFaultInjectingBackend(std::unique_ptr<Backend> inner,
                                                   int64_t ok_layers);

}  // namespace indexer
