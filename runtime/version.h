#pragma once

namespace rdmaflow {
// "0.1.0"
const char* version();
}  // namespace rdmaflow
