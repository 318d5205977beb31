#pragma once
// Values no size or count may be read as, for the tests that feed them to every parser,
// environment variable and command-line flag: each must be refused with a message that
// names what refused it and shows the text as given.

#include <string_view>

namespace vram::test {

struct hostile_value {
  const char* what;       // for the test's messages
  std::string_view text;  // may hold a NUL (only a string_view carries one)
};

using namespace std::string_view_literals;

/// Refused by vram::parse_bytes and vram::parse_count alike, and so by every consumer.
inline constexpr hostile_value hostile_values[] = {
    {"empty", ""sv},
    {"a blank before", " 5"sv},
    {"a blank after", "5 "sv},
    {"a tab before", "\t5"sv},
    {"a newline after", "5\n"sv},
    {"a fraction", "1.5"sv},
    {"a fraction without digits before", ".5"sv},
    {"hex", "0x10"sv},
    {"negative", "-1"sv},
    {"a plus sign", "+5"sv},
    {"an exponent", "1e3"sv},
    {"2^64", "18446744073709551616"sv},
    {"overflow", "99999999999999999999"sv},
    {"a word", "lots"sv},
    {"a number and a word", "12 apples"sv},
    {"infinity", "inf"sv},
};

/// Refused only where the channel carries a NUL (a string_view; not the environment or argv).
inline constexpr hostile_value hostile_with_nul[] = {
    {"a NUL after", "5\0"sv},
    {"a NUL inside", "1\0G"sv},
};

/// Sizes beyond vram::max_request_bytes (64 PiB), or not a whole number of bytes.
inline constexpr hostile_value hostile_sizes[] = {
    {"2^56 + 1 bytes", "72057594037927937"sv},
    {"65537 TiB", "65537T"sv},
    {"overflow with a unit", "99999999999999999999G"sv},
    {"a fraction of a byte with a unit", "0.1K"sv},
    {"a fraction of a byte", "2.5B"sv},
    {"a unit twice", "5GG"sv},
    {"a blank before the unit", "5 G"sv},
};

/// Counts parse_count reads but no count of devices, layers or steps can be.
inline constexpr hostile_value huge_counts[] = {
    {"2^32 + 1", "4294967297"sv},
    {"2^64 - 1", "18446744073709551615"sv},
};

}  // namespace vram::test
