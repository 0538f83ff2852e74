// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The device status word of the `_async` verbs: what failed in a data check, recorded on the
/// device and thrown on the host (`cuda_resources::check`) as the blocking verb would throw it.

#include <xsoftmax/config.hpp>
#include <xsoftmax/error.hpp>

#include <cstdint>

namespace xsoftmax::detail::gpu {

/// What failed in a data check of an `_async` verb (done on the device, recorded here, thrown on
/// the host by `cuda_resources::check`). Lives in device memory; written by one thread, and only
/// while `kind` is `none`, so it keeps the first failure in stream order.
struct device_status {
  enum kind_type : int {
    none = 0,
    hidden_not_finite = 1,    ///< hidden[i][j] = value_f
    target_out_of_range = 2,  ///< targets[i] = value_i, classes [0, num_classes), ignore_index
    upstream_not_finite = 3,  ///< the upstream gradient value_f
  };
  int kind;
  int unused;
  std::uint64_t where;  ///< the verb's name: a host pointer to a string literal, never read on the device
  index_t i, j, value_i, num_classes, ignore_index;
  float value_f;
};

/// Throws the exception (type and message) the blocking verb throws for the failure in `s`.
[[noreturn]] inline void throw_status(const device_status& s) {
  const char* where = reinterpret_cast<const char*>(static_cast<std::uintptr_t>(s.where));
  switch (s.kind) {
    case device_status::hidden_not_finite:
      throw non_finite_error(message(where, ": hidden[", s.i, "][", s.j, "] = ", s.value_f, " is not finite"));
    case device_status::target_out_of_range:
      throw out_of_range(message(where, ": targets[", s.i, "] = ", s.value_i, " is out of range [0, ",
                                 s.num_classes, ")", " and is not ignore_index (", s.ignore_index, ")"));
    case device_status::upstream_not_finite:
      throw non_finite_error(message(where, ": grad_output gives a non-finite upstream gradient ", s.value_f));
    default:
      throw cuda_error(message("corrupt device status (kind ", s.kind, ")"));
  }
}

}  // namespace xsoftmax::detail::gpu
