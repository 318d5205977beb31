#pragma once
// A pickle writer restricted to the opcodes PyTorch's MemoryViz.js unpickler accepts (PROTO 2,
// EMPTY_DICT/EMPTY_LIST + MARK + SETITEMS/APPENDS, TUPLE2, BININT1/BININT2/BININT, LONG1 of at
// most 8 bytes, SHORT_BINUNICODE/BINUNICODE, NONE, NEWTRUE/NEWFALSE, BINFLOAT, STOP), so a
// snapshot we write opens in pytorch.org/memory_viz as well as in Python's pickle.
// No memo is written: values are small and rarely repeated, and the viewer does not need it.

#include <bit>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>

namespace vram::detail {

class pickle_writer {
 public:
  pickle_writer() { out_ += "\x80\x02"; }  // PROTO 2

  void dict_begin() { out_ += "}("; }  // EMPTY_DICT MARK
  void dict_end() { out_ += 'u'; }     // SETITEMS
  void list_begin() { out_ += "]("; }  // EMPTY_LIST MARK
  void list_end() { out_ += 'e'; }     // APPENDS
  void tuple2_end() { out_ += '\x86'; } // TUPLE2: the last two values become a tuple

  void none() { out_ += 'N'; }
  void boolean(bool v) { out_ += v ? '\x88' : '\x89'; }

  void integer(std::int64_t v) {
    if (v >= 0 && v < 256) {
      out_ += 'K';
      out_ += static_cast<char>(v);
    } else if (v >= 0 && v < 65536) {
      out_ += 'M';
      put_le(static_cast<std::uint64_t>(v), 2);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
      out_ += 'J';
      put_le(static_cast<std::uint32_t>(static_cast<std::int32_t>(v)), 4);
    } else {
      // LONG1: minimal two's-complement little-endian bytes (at most 8 for an int64).
      int n = 8;
      while (n > 1) {
        std::int64_t top = v >> ((n - 1) * 8 - 1);  // the bits the shorter form could not hold
        if (top != 0 && top != -1) break;
        --n;
      }
      out_ += '\x8a';
      out_ += static_cast<char>(n);
      put_le(static_cast<std::uint64_t>(v), n);
    }
  }
  /// Addresses and sizes: user-space pointers are below 2^63, so they fit LONG1's 8 bytes.
  void integer(std::uint64_t v) { integer(static_cast<std::int64_t>(v)); }

  void floating(double v) {
    out_ += 'G';
    auto bits = std::bit_cast<std::uint64_t>(v);
    for (int i = 7; i >= 0; --i) out_ += static_cast<char>(bits >> (i * 8));
  }

  void string(std::string_view s) {
    if (s.size() < 256) {
      out_ += '\x8c';  // SHORT_BINUNICODE
      out_ += static_cast<char>(s.size());
    } else {
      out_ += 'X';  // BINUNICODE
      put_le(s.size(), 4);
    }
    out_ += s;
  }

  /// Appends STOP and returns the bytes.
  std::string finish() && {
    out_ += '.';
    return std::move(out_);
  }

 private:
  void put_le(std::uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out_ += static_cast<char>(v >> (i * 8));
  }
  std::string out_;
};

}  // namespace vram::detail
