// Element types shared by the graph analyzer and the collectives.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace rdmaflow {

enum class DataType : uint8_t {
  kF32,
  kF64,
  kF16,
  kBF16,
  kI32,
  kI64,
  kU8,
  kI8,
  kBool,
};

inline constexpr DataType kAllDataTypes[] = {DataType::kF32,  DataType::kF64, DataType::kF16,
                                             DataType::kBF16, DataType::kI32, DataType::kI64,
                                             DataType::kU8,   DataType::kI8,  DataType::kBool};

// Bytes per element.
size_t dtype_size(DataType t);
// "f32", "f64", "f16", "bf16", "i32", "i64", "u8", "i8", "bool".
std::string_view dtype_name(DataType t);
// Inverse of dtype_name (also accepts "float32", "float", "float16", "bfloat16", "int32",
// "int64", "uint8", "int8", "double", "half"); nullopt for anything else.
std::optional<DataType> parse_dtype(std::string_view name);

}  // namespace rdmaflow
