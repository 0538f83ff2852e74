// SPDX-License-Identifier: Apache-2.0
// The step drivers' timing loop (full_softmax_step.cpp, hs_uniform_step.cpp): runs a step `steps`
// times, prints each with its loss, and returns the best and mean time after the first (which also
// pays for first-touch page faults).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>

struct step_times {
  double best = 1e30;  ///< seconds
  double mean = 0;     ///< seconds
};

/// `step()` returns the step's loss.
template <class Step>
step_times time_steps(int steps, Step&& step) {
  step_times t;
  double sum = 0;
  for (int s = 0; s < steps; ++s) {
    const auto start = std::chrono::steady_clock::now();
    const float loss = step();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("step %d: %.1f ms, loss %.4f\n", s, seconds * 1e3, loss);
    if (s > 0) t.best = std::min(t.best, seconds), sum += seconds;
  }
  t.mean = steps > 1 ? sum / (steps - 1) : 0;
  return t;
}
