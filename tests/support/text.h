// Small text checks the tests share.
#pragma once

#include <string>

namespace rdmaflow::testing {

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace rdmaflow::testing
