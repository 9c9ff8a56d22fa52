// Command-line parsing shared by every rdmaflow tool, so that they all read a
// size the same way and answer a bad command line the same way.
//
//   CLI::App app{"what the tool does", "tool-name"};
//   rdmaflow::cli::configure(app);
//   size_t bytes = 1 << 20;
//   rdmaflow::cli::add_size(app, "--bytes", bytes, "bytes per message");
//   if (auto exit_code = rdmaflow::cli::parse(app, argc, argv)) return *exit_code;
#pragma once

#include <CLI/CLI.hpp>
#include <cctype>
#include <cstdint>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace rdmaflow::cli {

// Exit status of a tool given a command line it cannot run (the same for all tools,
// so scripts can tell a usage error from a failed run).
inline constexpr int kUsageError = 2;

// Bytes in `text`: digits and an optional binary suffix K, M or G (K = 1024;
// KiB, KB and lower case mean the same). Empty on anything else.
inline std::optional<uint64_t> parse_size(const std::string& text) {
  size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  if (digits == 0 || digits > 19) return std::nullopt;
  std::string unit = text.substr(digits);
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  int shift = 0;
  if (!unit.empty()) {
    const size_t prefix = std::string("kmg").find(unit[0]);
    const std::string rest = unit.substr(1);
    if (prefix == std::string::npos || (rest != "" && rest != "b" && rest != "ib")) {
      return std::nullopt;
    }
    shift = 10 * static_cast<int>(prefix + 1);
  }
  const uint64_t n = std::stoull(text.substr(0, digits));
  if (n > (std::numeric_limits<uint64_t>::max() >> shift)) return std::nullopt;
  return n << shift;
}

// The shortest exact spelling of `bytes` parse_size reads back: 16M, 1K, 4097.
inline std::string size_text(uint64_t bytes) {
  for (auto [shift, suffix] : {std::pair{30, "G"}, {20, "M"}, {10, "K"}}) {
    const uint64_t unit = uint64_t{1} << shift;
    if (bytes >= unit && bytes % unit == 0) return std::to_string(bytes / unit) + suffix;
  }
  return std::to_string(bytes);
}

// Turns a size (parse_size) into its bytes; a value parse_size refuses is an
// error naming the option and the form expected.
inline CLI::Validator as_bytes() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        auto n = parse_size(value);
        if (!n)
          return "'" + value + "' is not a size: bytes, or a number with K, M or G (K = 1024)";
        value = std::to_string(*n);
        return "";
      },
      "", "size");
}

// Refuses a number below `min`, naming it. A value that is no number at all
// passes here and is refused by the conversion to the option's type, which
// names it too (CLI11's own PositiveNumber reports it as out of a range up to
// the largest double).
inline CLI::Validator at_least(double min) {
  return CLI::Validator(
      [min](std::string& value) -> std::string {
        double v = 0;
        if (!CLI::detail::lexical_cast(value, v) || v >= min) return "";
        std::ostringstream text;
        text << "must be at least " << min << ", not " << value;
        return text.str();
      },
      "", "at least");
}

// Adds an option taking a size; its default is shown as a size.
template <typename T>
CLI::Option* add_size(CLI::App& app, const std::string& name, T& bytes,
                      const std::string& description) {
  return app.add_option(name, bytes, description)
      ->type_name("SIZE")
      ->transform(as_bytes())
      ->default_str(size_text(static_cast<uint64_t>(bytes)));
}

// Adds an option taking a comma-separated list of sizes (8,1M,16M).
template <typename T>
CLI::Option* add_sizes(CLI::App& app, const std::string& name, std::vector<T>& list,
                       const std::string& description) {
  return app.add_option(name, list, description)
      ->type_name("SIZE,...")
      ->delimiter(',')
      ->transform(as_bytes());
}

// Settings every tool shares: defaults shown in --help; a bad command line
// answered with what was wrong followed by the full list of options.
inline void configure(CLI::App& app) {
  app.option_defaults()->always_capture_default();
  app.get_formatter()->column_width(32);
  app.failure_message([](const CLI::App* a, const CLI::Error& e) {
    return a->get_name() + ": " + e.what() + "\n\n" + a->help();
  });
}

// Parses the command line. Returns the exit status when the tool should stop
// here: 0 after --help (printed on stdout), kUsageError after a bad command
// line (reported on stderr).
inline std::optional<int> parse(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : kUsageError;
  }
  return std::nullopt;
}

}  // namespace rdmaflow::cli
