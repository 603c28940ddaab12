// The text of an exception caught at this crate's C boundary, for the Rust side to report.
//
// Why: libtorch's `c10::Error::what()` appends the C++ backtrace of where the error was raised, dozens of frames
// that end up in a user's log line under the one sentence that says what went wrong (a shape mismatch, a wrong
// dtype). `what_without_backtrace()` is that sentence.

#pragma once

#include <c10/util/Exception.h>

#include <exception>
#include <string>

inline std::string error_message(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) return c10_error->what_without_backtrace();
  return e.what();
}
