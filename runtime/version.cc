#include "runtime/version.h"

namespace rdmaflow {
const char* version() {
  return "0.1.0";
}
}  // namespace rdmaflow
