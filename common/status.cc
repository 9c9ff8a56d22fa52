#include "common/status.h"

namespace rdmaflow {

std::string_view code_name(Code code) {
  switch (code) {
    case Code::kOk:
      return "ok";
    case Code::kInvalidArgument:
      return "invalid argument";
    case Code::kNotFound:
      return "not found";
    case Code::kOutOfRange:
      return "out of range";
    case Code::kTimeout:
      return "timeout";
    case Code::kConnectionFailed:
      return "connection failed";
    case Code::kPeerFailed:
      return "peer failed";
    case Code::kProtocolError:
      return "protocol error";
    case Code::kNotViable:
      return "not viable";
    case Code::kCancelled:
      return "cancelled";
    case Code::kResourceExhausted:
      return "resource exhausted";
    case Code::kInternal:
      return "internal error";
    case Code::kUnauthenticated:
      return "unauthenticated";
  }
  return "unknown";
}

namespace {
// Keep paths short and relative to the repository: ".../rdmaflow/transport/x.cc" ->
// "transport/x.cc".
std::string short_path(std::string_view file) {
  static constexpr std::string_view kLayers[] = {
      "/runtime/", "/transport/", "/graph/", "/allocator/", "/collectives/", "/tests/", "/bench/"};
  size_t best = std::string_view::npos;
  for (auto layer : kLayers) {
    size_t pos = file.rfind(layer);
    if (pos != std::string_view::npos && (best == std::string_view::npos || pos > best)) best = pos;
  }
  if (best != std::string_view::npos) return std::string(file.substr(best + 1));
  size_t slash = file.rfind('/');
  return std::string(slash == std::string_view::npos ? file : file.substr(slash + 1));
}
}  // namespace

Status::Status(Code code, std::string op, int peer, std::string reason, SourceLocation where)
    : code_(code), peer_(peer), op_(std::move(op)), reason_(std::move(reason)) {
  if (code_ != Code::kOk) {
    where_ = short_path(where.file_name()) + ":" + std::to_string(where.line());
  }
}

std::string Status::to_string() const {
  if (is_ok()) return "OK";
  std::string s = op_.empty() ? std::string("operation") : op_;
  if (peer_ >= 0) s += " (peer rank " + std::to_string(peer_) + ")";
  s += " failed: ";
  s += code_name(code_);
  s += ": ";
  s += reason_;
  if (!where_.empty()) s += " [" + where_ + "]";
  return s;
}

Status Status::with_op(std::string op) const {
  Status s = *this;
  s.op_ = std::move(op);
  return s;
}

}  // namespace rdmaflow
