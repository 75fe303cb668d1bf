// The one error convention: FKT_CHECK(cond) << "message" throws fkt::Error carrying file and line.
// The C ABI catches it and hands the text to fkt_last_error().
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace fkt {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// Collects the message with operator<< and throws when destroyed (at the end of the statement).
class ErrorBuilder {
 public:
  ErrorBuilder(const char* file, int line) { stream_ << file << ":" << line << ": "; }
  ErrorBuilder(const ErrorBuilder&) = delete;
  [[noreturn]] ~ErrorBuilder() noexcept(false) { throw Error(stream_.str()); }
  template <typename T>
  ErrorBuilder& operator<<(const T& value) {
    stream_ << value;
    return *this;
  }

 private:
  std::ostringstream stream_;
};

}  // namespace fkt

#define FKT_CHECK(cond) \
  if (cond) {           \
  } else                \
    ::fkt::ErrorBuilder(__FILE__, __LINE__)

#define FKT_FAIL() ::fkt::ErrorBuilder(__FILE__, __LINE__)
