// The exception barrier of every extern "C" shim: an exception becomes status 1 and its message
// becomes fkt_last_error() of the calling thread.
#pragma once

#include <exception>
#include <string>

namespace fkt {

// The message of the last failed C ABI call on this thread; cleared by every successful one.
inline thread_local std::string last_error;

template <typename Body>
int guarded(Body body) {
  try {
    body();
    last_error.clear();
    return 0;
  } catch (const std::exception& e) {
    last_error = e.what();
  } catch (...) {
    last_error = "unknown error";
  }
  return 1;
}

}  // namespace fkt
