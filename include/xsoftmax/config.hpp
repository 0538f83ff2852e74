// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Library-wide configuration: version, the host/device function qualifier, and the Thrust device
/// system a host-only build uses.

#define XSOFTMAX_VERSION_MAJOR 0
#define XSOFTMAX_VERSION_MINOR 1
#define XSOFTMAX_VERSION_PATCH 0

// A host compiler cannot use Thrust's CUDA device system. The library never relies on Thrust's
// *default* device system (every call names an execution policy), but Thrust's headers need one to
// be set: a host build gets the plain C++ one unless the user chose otherwise before us.
#if !defined(__CUDACC__) && !defined(THRUST_DEVICE_SYSTEM)
#define THRUST_DEVICE_SYSTEM THRUST_DEVICE_SYSTEM_CPP
#endif

/// `__host__ __device__` under nvcc, nothing otherwise: functors written once run on every backend.
#if defined(__CUDACC__)
#define XSOFTMAX_HD __host__ __device__
#else
#define XSOFTMAX_HD
#endif

#include <cstdint>

namespace xsoftmax {

/// Index type for rows, classes and element offsets. 64-bit so that a 100M x 512 weight matrix
/// (5.1e10 elements) is addressable.
using index_t = std::int64_t;

}  // namespace xsoftmax
