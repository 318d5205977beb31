#pragma once
// Python pickles, both ways.
//
// pickle_reader, a restricted unpickler: reads Python pickles (protocols 2-5) that hold only built-in
// values -- dict, list, tuple, set, str, bytes, int, float, bool, None -- as PyTorch memory
// snapshots do. It never executes anything: GLOBAL, REDUCE, BUILD, object construction and
// persistent ids are refused with an error. Every read is bounds-checked; every error names
// the source and the byte offset of the offending opcode.
//
// Values live in one arena (`pickle_document::nodes`) and refer to each other by index, so
// cyclic references built through the memo (a list appended to itself) are representable
// and free to destroy; consumers that walk the graph must bound their depth themselves.
//
// pickle_writer, restricted to the opcodes PyTorch's MemoryViz.js unpickler accepts (PROTO 2,
// EMPTY_DICT/EMPTY_LIST + MARK + SETITEMS/APPENDS, TUPLE2, BININT1/BININT2/BININT, LONG1 of at
// most 8 bytes, SHORT_BINUNICODE/BINUNICODE, NONE, NEWTRUE/NEWFALSE, BINFLOAT, STOP), so a
// snapshot we write opens in pytorch.org/memory_viz as well as in Python's pickle.
// No memo is written: values are small and rarely repeated, and the viewer does not need it.

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace vram::detail::trace {

/// A malformed, truncated or refused pickle; what() names the source and byte offset.
class pickle_error : public std::runtime_error {
 public:
  pickle_error(const std::string& what, std::size_t offset) : std::runtime_error(what), offset_(offset) {}
  [[nodiscard]] std::size_t offset() const noexcept { return offset_; }

 private:
  std::size_t offset_;
};

struct pickle_node {
  enum class kind : std::uint8_t { none, boolean, integer, big_integer, floating, string, bytes, list, tuple, dict, set };
  kind type = kind::none;
  std::int64_t integer = 0;  // integer, boolean (0/1)
  double floating = 0;
  std::string text;                                      // string, bytes
  std::vector<std::uint32_t> items;                      // list, tuple, set
  std::vector<std::pair<std::uint32_t, std::uint32_t>> entries;  // dict: key, value (insertion order)
};

/// The unpickled value graph; `root` indexes `nodes`.
struct pickle_document {
  std::vector<pickle_node> nodes;
  std::uint32_t root = 0;

  [[nodiscard]] const pickle_node& at(std::uint32_t i) const { return nodes[i]; }
  /// The value for string key `key` in dict `dict`, or nullptr (also when `dict` is no dict).
  [[nodiscard]] const pickle_node* find(const pickle_node& dict, std::string_view key) const {
    if (dict.type != pickle_node::kind::dict) return nullptr;
    for (auto [k, v] : dict.entries)
      if (nodes[k].type == pickle_node::kind::string && nodes[k].text == key) return &nodes[v];
    return nullptr;
  }
};

/// Parses `data`. `source` names it in errors. `max_nodes` bounds the memory a hostile file
/// can make us use (each node is about 100 bytes).
inline pickle_document parse_pickle(std::string_view data, const std::string& source,
                                    std::size_t max_nodes = std::size_t{1} << 26) {
  using kind = pickle_node::kind;
  pickle_document doc;
  std::vector<std::uint32_t> stack;
  std::vector<std::size_t> marks;
  std::vector<std::uint32_t> memo;
  constexpr std::uint32_t no_memo = UINT32_MAX;
  std::size_t pos = 0, op_pos = 0;

  auto fail = [&](const std::string& what) -> void {
    throw pickle_error(source + ": pickle: at byte " + std::to_string(op_pos) + ": " + what, op_pos);
  };
  auto need = [&](std::size_t n) {
    if (n > data.size() - pos) fail("truncated file");
  };
  auto read_le = [&](std::size_t n) -> std::uint64_t {
    need(n);
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < n; ++i) v |= std::uint64_t(static_cast<unsigned char>(data[pos + i])) << (8 * i);
    pos += n;
    return v;
  };
  auto make = [&](kind k) -> std::uint32_t {
    if (doc.nodes.size() >= max_nodes) fail("too many values");
    doc.nodes.emplace_back();
    doc.nodes.back().type = k;
    return static_cast<std::uint32_t>(doc.nodes.size() - 1);
  };
  auto push = [&](std::uint32_t i) { stack.push_back(i); };
  auto pop = [&]() -> std::uint32_t {
    if (stack.size() <= (marks.empty() ? 0 : marks.back())) fail("stack underflow");
    std::uint32_t v = stack.back();
    stack.pop_back();
    return v;
  };
  auto top = [&]() -> std::uint32_t {
    if (stack.size() <= (marks.empty() ? 0 : marks.back())) fail("stack underflow");
    return stack.back();
  };
  auto pop_mark = [&]() -> std::size_t {  // returns the stack index where the marked items begin
    if (marks.empty()) fail("no MARK on the stack");
    std::size_t m = marks.back();
    marks.pop_back();
    return m;
  };
  auto text = [&](kind k, std::uint64_t n) {
    need(n);  // also rejects lengths beyond the file, before allocating anything
    std::uint32_t i = make(k);
    doc.nodes[i].text.assign(data.substr(pos, n));
    pos += n;
    push(i);
  };
  auto integer = [&](std::int64_t v) {
    std::uint32_t i = make(kind::integer);
    doc.nodes[i].integer = v;
    push(i);
  };
  auto long_bytes = [&](std::uint64_t n) {
    need(n);
    if (n > 8) {  // beyond int64: kept as a marker, its value is never needed
      pos += n;
      push(make(kind::big_integer));
      return;
    }
    std::uint64_t v = 0;
    for (std::size_t b = 0; b < n; ++b) v |= std::uint64_t(static_cast<unsigned char>(data[pos + b])) << (8 * b);
    if (n > 0 && n < 8 && (static_cast<unsigned char>(data[pos + n - 1]) & 0x80)) v |= ~std::uint64_t{0} << (8 * n);
    pos += n;
    integer(static_cast<std::int64_t>(v));
  };
  auto sequence = [&](kind k, std::size_t from) {
    std::uint32_t i = make(k);
    doc.nodes[i].items.assign(stack.begin() + static_cast<std::ptrdiff_t>(from), stack.end());
    stack.resize(from);
    push(i);
  };
  auto container = [&](std::uint32_t i, kind k) -> pickle_node& {
    if (doc.nodes[i].type != k) fail("operation on a value of the wrong type");
    return doc.nodes[i];
  };
  auto set_items = [&](std::uint32_t dict, std::size_t from) {
    if ((stack.size() - from) % 2 != 0) fail("odd number of items for a dict");
    for (std::size_t k = from; k < stack.size(); k += 2) container(dict, kind::dict).entries.emplace_back(stack[k], stack[k + 1]);
    stack.resize(from);
  };
  auto memo_put = [&](std::uint64_t key) {
    // Picklers number memo entries in order, so a key far beyond the values made so far is
    // hostile (it would make us allocate a huge memo from a tiny file).
    if (key > doc.nodes.size() + 1024) fail("memo index out of range");
    if (memo.size() <= key) memo.resize(key + 1, no_memo);
    memo[key] = top();
  };
  auto memo_get = [&](std::uint64_t key) {
    if (key >= memo.size() || memo[key] == no_memo) fail("memo key not defined");
    push(memo[key]);
  };

  for (;;) {
    op_pos = pos;
    need(1);
    auto op = static_cast<unsigned char>(data[pos++]);
    switch (op) {
      case 0x80: {  // PROTO
        auto v = read_le(1);
        if (v < 2 || v > 5) fail("unsupported pickle protocol " + std::to_string(v));
        break;
      }
      case 0x95: read_le(8); break;  // FRAME: a size hint only
      case '.':                      // STOP
        if (stack.size() != 1 || !marks.empty()) fail("STOP with a malformed stack");
        doc.root = stack.back();
        if (pos != data.size()) {
          op_pos = pos;
          fail("trailing data after STOP");
        }
        return doc;
      case '(': marks.push_back(stack.size()); break;  // MARK
      case '}': push(make(kind::dict)); break;
      case ']': push(make(kind::list)); break;
      case ')': push(make(kind::tuple)); break;
      case 0x8f: push(make(kind::set)); break;  // EMPTY_SET
      case 'N': push(make(kind::none)); break;
      case 0x88:
      case 0x89: {  // NEWTRUE / NEWFALSE
        std::uint32_t i = make(kind::boolean);
        doc.nodes[i].integer = op == 0x88;
        push(i);
        break;
      }
      case 'J': integer(static_cast<std::int32_t>(static_cast<std::uint32_t>(read_le(4)))); break;  // BININT
      case 'K': integer(static_cast<std::int64_t>(read_le(1))); break;                              // BININT1
      case 'M': integer(static_cast<std::int64_t>(read_le(2))); break;                              // BININT2
      case 0x8a: long_bytes(read_le(1)); break;                                                     // LONG1
      case 0x8b: long_bytes(read_le(4)); break;                                                     // LONG4
      case 'G': {  // BINFLOAT: big-endian IEEE double
        need(8);
        std::uint64_t bits = 0;
        for (int b = 0; b < 8; ++b) bits = (bits << 8) | static_cast<unsigned char>(data[pos + b]);
        pos += 8;
        std::uint32_t i = make(kind::floating);
        std::memcpy(&doc.nodes[i].floating, &bits, sizeof bits);
        push(i);
        break;
      }
      case 0x8c: text(kind::string, read_le(1)); break;  // SHORT_BINUNICODE
      case 'X': text(kind::string, read_le(4)); break;   // BINUNICODE
      case 0x8d: text(kind::string, read_le(8)); break;  // BINUNICODE8
      case 'C': text(kind::bytes, read_le(1)); break;    // SHORT_BINBYTES
      case 'B': text(kind::bytes, read_le(4)); break;    // BINBYTES
      case 0x8e: text(kind::bytes, read_le(8)); break;   // BINBYTES8
      case 0x96: text(kind::bytes, read_le(8)); break;   // BYTEARRAY8
      case 0x85:
      case 0x86:
      case 0x87: {  // TUPLE1..3
        std::size_t n = op - 0x84u;
        std::size_t floor = marks.empty() ? 0 : marks.back();
        if (stack.size() < floor + n) fail("stack underflow");
        sequence(kind::tuple, stack.size() - n);
        break;
      }
      case 't': sequence(kind::tuple, pop_mark()); break;        // TUPLE
      case 'l': sequence(kind::list, pop_mark()); break;         // LIST
      case 0x91: sequence(kind::set, pop_mark()); break;         // FROZENSET
      case 'd': {                                                // DICT
        std::size_t from = pop_mark();
        std::uint32_t i = make(kind::dict);
        std::vector<std::uint32_t> items(stack.begin() + static_cast<std::ptrdiff_t>(from), stack.end());
        stack.resize(from);
        stack.push_back(i);
        stack.insert(stack.end(), items.begin(), items.end());
        set_items(i, from + 1);
        break;
      }
      case 'a': {  // APPEND
        std::uint32_t v = pop();
        container(top(), kind::list).items.push_back(v);
        break;
      }
      case 'e':       // APPENDS
      case 0x90: {    // ADDITEMS
        std::size_t from = pop_mark();
        if (from == 0 || (!marks.empty() && from <= marks.back())) fail("stack underflow");
        auto& c = container(stack[from - 1], op == 'e' ? kind::list : kind::set);
        c.items.insert(c.items.end(), stack.begin() + static_cast<std::ptrdiff_t>(from), stack.end());
        stack.resize(from);
        break;
      }
      case 's': {  // SETITEM
        std::uint32_t v = pop(), k = pop();
        container(top(), kind::dict).entries.emplace_back(k, v);
        break;
      }
      case 'u': {  // SETITEMS
        std::size_t from = pop_mark();
        if (from == 0 || (!marks.empty() && from <= marks.back())) fail("stack underflow");
        set_items(stack[from - 1], from);
        break;
      }
      case 0x94: memo_put(memo.size()); break;  // MEMOIZE
      case 'q': memo_put(read_le(1)); break;    // BINPUT
      case 'r': memo_put(read_le(4)); break;    // LONG_BINPUT
      case 'h': memo_get(read_le(1)); break;    // BINGET
      case 'j': memo_get(read_le(4)); break;    // LONG_BINGET
      case '0': pop(); break;                   // POP
      case '1': stack.resize(pop_mark()); break;  // POP_MARK
      case '2': push(top()); break;             // DUP
      case 'c': case 0x93: case 'i':
        fail("refusing to import a global (only built-in types are allowed)");
        break;
      case 'R': case 'b': case 'o': case 0x81: case 0x92:
        fail("refusing to call or build an object (only built-in types are allowed)");
        break;
      case 'P': case 'Q': fail("refusing a persistent id"); break;
      case 0x82: case 0x83: case 0x84: fail("refusing an extension-registry reference"); break;
      case 0x97: case 0x98: fail("out-of-band buffers are not supported"); break;
      default: {
        char buf[64];
        std::snprintf(buf, sizeof buf, "unsupported opcode 0x%02x", op);
        fail(buf);
      }
    }
  }
}

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

}  // namespace vram::detail::trace
