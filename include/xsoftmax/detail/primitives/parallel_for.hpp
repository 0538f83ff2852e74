// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `parallel_for(ex, n, f)`: f(i) for i in [0, n) on an execution's threads or device, through
/// Thrust (defined with `execution` in detail/execution.hpp).

#include <xsoftmax/detail/execution.hpp>
