// Status and Result<T>: the error vocabulary of every rdmaflow layer.
//
// A Status names the operation that failed, the peer rank involved (if any), the
// reason, and where it was raised ("[file:line]"), so a user can act on it:
//   "write (peer rank 3) failed: timeout: no completion after 30000 ms
//    [transport/tcp/tcp_channel.cc:210]"
// rdmaflow never throws or aborts on peer failure or bad input; it returns these.
#pragma once

#include <cstdint>
#include <optional>
#include <source_location>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace rdmaflow {

#if defined(__cpp_lib_source_location)
using SourceLocation = std::source_location;
#else
// Stand-in for compilers whose standard library lacks std::source_location
// (Debian's clang 14 with libstdc++ 12, used for the libFuzzer builds). With
// g++ SourceLocation is std::source_location itself.
class SourceLocation {
 public:
  static constexpr SourceLocation current(const char* file = __builtin_FILE(),
                                          unsigned line = __builtin_LINE()) noexcept {
    SourceLocation l;
    l.file_ = file;
    l.line_ = line;
    return l;
  }
  constexpr const char* file_name() const noexcept { return file_; }
  constexpr unsigned line() const noexcept { return line_; }

 private:
  const char* file_ = "";
  unsigned line_ = 0;
};
#endif

enum class Code : uint8_t {
  kOk = 0,
  kInvalidArgument,    // caller passed something malformed
  kNotFound,           // unknown key, name or rank
  kOutOfRange,         // access outside a granted range
  kTimeout,            // a wait exceeded its deadline
  kConnectionFailed,   // could not establish a connection
  kPeerFailed,         // the peer went away or its channel broke
  kProtocolError,      // malformed frame or unexpected message
  kNotViable,          // backend cannot run here (e.g. no RDMA device)
  kCancelled,          // operation abandoned because the channel closed
  kResourceExhausted,  // out of memory, slots or credits
  kInternal,           // a bug or an unexpected library failure
  kUnauthenticated,    // a peer failed the job handshake or presented a forged key secret
};

std::string_view code_name(Code code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK

  Status(Code code, std::string op, int peer, std::string reason,
         SourceLocation where = SourceLocation::current());

  static Status ok() { return Status(); }

  bool is_ok() const { return code_ == Code::kOk; }
  explicit operator bool() const { return is_ok(); }
  Code code() const { return code_; }
  const std::string& op() const { return op_; }
  int peer() const { return peer_; }  // -1 when no peer is involved
  const std::string& reason() const { return reason_; }
  const std::string& where() const { return where_; }

  // "write (peer rank 3) failed: <code>: <reason> [file:line]"
  std::string to_string() const;

  // Same failure reported for another operation (keeps reason, peer and origin).
  Status with_op(std::string op) const;

 private:
  Code code_ = Code::kOk;
  int peer_ = -1;
  std::string op_;
  std::string reason_;
  std::string where_;
};

// Result<T>: either a value or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}         // NOLINT(google-explicit-constructor)
  Result(Status status) : v_(std::move(status)) {}  // NOLINT(google-explicit-constructor)

  bool is_ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return is_ok(); }

  const Status& status() const {
    static const Status kOk;
    return is_ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

// Shorthands that capture the caller's location.
#define RDMAFLOW_ERROR(code, op, peer, reason) \
  ::rdmaflow::Status((code), (op), (peer), (reason), ::rdmaflow::SourceLocation::current())

#define RDMAFLOW_RETURN_IF_ERROR(expr)  \
  do {                                  \
    ::rdmaflow::Status _rf_st = (expr); \
    if (!_rf_st.is_ok()) return _rf_st; \
  } while (0)

#define RDMAFLOW_CONCAT_INNER(a, b) a##b
#define RDMAFLOW_CONCAT(a, b) RDMAFLOW_CONCAT_INNER(a, b)
#define RDMAFLOW_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                   \
  if (!tmp.is_ok()) return tmp.status();               \
  lhs = std::move(tmp).value()
#define RDMAFLOW_ASSIGN_OR_RETURN(lhs, expr) \
  RDMAFLOW_ASSIGN_OR_RETURN_IMPL(RDMAFLOW_CONCAT(_rf_res_, __LINE__), lhs, expr)

}  // namespace rdmaflow
