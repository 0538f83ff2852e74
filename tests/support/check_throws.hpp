// SPDX-License-Identifier: Apache-2.0
#pragma once
/// `check_throws<Error>(f, {substrings})`: `f` throws exactly an `Error` (or a derived type) whose
/// message holds every substring (typed errors that name the argument and the value).

#include <doctest/doctest.h>

#include <exception>
#include <initializer_list>
#include <string>

namespace xsoftmax_test {

template <class Error, class F>
void check_throws(F&& f, std::initializer_list<const char*> substrings) {
  std::string what;
  bool caught = false;
  try {
    f();
  } catch (const Error& e) {
    caught = true;
    what = e.what();
  } catch (const std::exception& e) {
    what = std::string("wrong exception type: ") + e.what();
  }
  INFO("message: ", what);
  REQUIRE(caught);
  for (const char* s : substrings) {
    INFO("expected substring: ", s);
    CHECK(what.find(s) != std::string::npos);
  }
}

/// The same with one substring.
template <class Error, class F>
void check_throws(F&& f, const char* substring) {
  check_throws<Error>(static_cast<F&&>(f), {substring});
}

}  // namespace xsoftmax_test
