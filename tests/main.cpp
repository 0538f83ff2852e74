// SPDX-License-Identifier: Apache-2.0
// The doctest runner for every tests/**/*_test.cpp, which are linked into this one executable.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
