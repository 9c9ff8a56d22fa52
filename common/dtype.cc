#include "common/dtype.h"

namespace rdmaflow {

size_t dtype_size(DataType t) {
  switch (t) {
    case DataType::kF32:
      return 4;
    case DataType::kF64:
      return 8;
    case DataType::kF16:
      return 2;
    case DataType::kBF16:
      return 2;
    case DataType::kI32:
      return 4;
    case DataType::kI64:
      return 8;
    case DataType::kU8:
      return 1;
    case DataType::kI8:
      return 1;
    case DataType::kBool:
      return 1;
  }
  return 0;
}

std::string_view dtype_name(DataType t) {
  switch (t) {
    case DataType::kF32:
      return "f32";
    case DataType::kF64:
      return "f64";
    case DataType::kF16:
      return "f16";
    case DataType::kBF16:
      return "bf16";
    case DataType::kI32:
      return "i32";
    case DataType::kI64:
      return "i64";
    case DataType::kU8:
      return "u8";
    case DataType::kI8:
      return "i8";
    case DataType::kBool:
      return "bool";
  }
  return "?";
}

std::optional<DataType> parse_dtype(std::string_view name) {
  struct Alias {
    std::string_view name;
    DataType type;
  };
  static constexpr Alias kAliases[] = {
      {"f32", DataType::kF32},   {"float32", DataType::kF32},   {"float", DataType::kF32},
      {"f64", DataType::kF64},   {"float64", DataType::kF64},   {"double", DataType::kF64},
      {"f16", DataType::kF16},   {"float16", DataType::kF16},   {"half", DataType::kF16},
      {"bf16", DataType::kBF16}, {"bfloat16", DataType::kBF16}, {"i32", DataType::kI32},
      {"int32", DataType::kI32}, {"i64", DataType::kI64},       {"int64", DataType::kI64},
      {"u8", DataType::kU8},     {"uint8", DataType::kU8},      {"i8", DataType::kI8},
      {"int8", DataType::kI8},   {"bool", DataType::kBool},
  };
  for (const auto& a : kAliases) {
    if (a.name == name) return a.type;
  }
  return std::nullopt;
}

}  // namespace rdmaflow
