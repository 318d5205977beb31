#pragma once
// Shared by the allocator harnesses: a reference model of live blocks and the checks run
// after every step. A harness decodes its input into operations with FuzzedDataProvider,
// applies each to the allocator and to the model, and calls check() after each.
//
// A finding is a crash: fuzz_fail() prints what went wrong and aborts, so libFuzzer saves
// the input (scripts/fuzz prints the command that reproduces it).

#include <fuzzer/FuzzedDataProvider.h>

#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <iterator>
#include <map>
#include <vector>

#include <vram/core/concepts.hpp>
#include <vram/core/error_handler.hpp>

namespace vram::fuzz {

[[noreturn]] inline void fuzz_fail(const char* what) {
  std::fprintf(stderr, "vram fuzz: %s\n", what);
  std::abort();
}

#define VRAM_FUZZ_CHECK(cond)                                                              \
  do {                                                                                     \
    if (!(cond)) ::vram::fuzz::fuzz_fail(__FILE__ ":" VRAM_FUZZ_STR(__LINE__) ": " #cond); \
  } while (0)
#define VRAM_FUZZ_STR2(x) #x
#define VRAM_FUZZ_STR(x) VRAM_FUZZ_STR2(x)

/// Counts misuse reports instead of printing them (harnesses expect them exactly when they
/// misuse on purpose).
struct misuse_counter {
  static inline std::size_t reports = 0;
  static void record(const misuse_report&) noexcept { ++reports; }
  misuse_counter() { previous = set_error_handler(&record); reports = 0; }
  ~misuse_counter() { set_error_handler(previous); }
  error_handler previous;
};

/// One live block in the model.
struct model_block {
  std::size_t bytes;
  std::size_t align;
  std::size_t stream;
  unsigned char pattern;  // written at allocation where memory is host-accessible
  std::size_t seq;        // allocation order
};

/// The reference model: what must be live. Non-overlap, alignment and (where the memory is
/// host-accessible) contents are checked against it.
class model {
 public:
  void add(void* p, std::size_t bytes, std::size_t align, std::size_t stream, bool writable) {
    VRAM_FUZZ_CHECK(p != nullptr);
    VRAM_FUZZ_CHECK(reinterpret_cast<std::uintptr_t>(p) % align == 0);
    auto* c = static_cast<char*>(p);
    // Disjoint from both neighbours.
    auto next = live_.lower_bound(c);
    VRAM_FUZZ_CHECK(next == live_.end() || c + bytes <= next->first);
    if (next != live_.begin()) {
      auto prev = std::prev(next);
      VRAM_FUZZ_CHECK(prev->first + prev->second.bytes <= c);
    }
    auto pattern = static_cast<unsigned char>(seq_ * 131 + 7);
    if (writable) fill(c, bytes, pattern);
    live_.emplace(c, model_block{bytes, align, stream, pattern, seq_++});
    bytes_ += bytes;
  }

  /// Removes and returns the block at p (pre: live).
  model_block take(void* p, bool writable) {
    auto it = live_.find(static_cast<char*>(p));
    VRAM_FUZZ_CHECK(it != live_.end());
    model_block b = it->second;
    if (writable) verify(it->first, b);
    bytes_ -= b.bytes;
    live_.erase(it);
    return b;
  }

  /// The k-th live block (by address), k taken modulo the count; pre: !empty().
  std::pair<char*, model_block> pick(std::size_t k) const {
    auto it = live_.begin();
    std::advance(it, static_cast<std::ptrdiff_t>(k % live_.size()));
    return *it;
  }

  bool is_live_start(const void* p) const { return live_.count(static_cast<char*>(const_cast<void*>(p))) != 0; }
  /// True when p lies inside some live block.
  bool inside_live(const void* p) const {
    auto* c = static_cast<char*>(const_cast<void*>(p));
    auto it = live_.upper_bound(c);
    if (it == live_.begin()) return false;
    --it;
    return c < it->first + it->second.bytes;
  }

  void verify_all() const {
    for (const auto& [p, b] : live_) verify(p, b);
  }

  [[nodiscard]] bool empty() const noexcept { return live_.empty(); }
  [[nodiscard]] std::size_t size() const noexcept { return live_.size(); }
  [[nodiscard]] std::size_t bytes() const noexcept { return bytes_; }
  [[nodiscard]] const std::map<char*, model_block>& blocks() const noexcept { return live_; }
  void clear() { live_.clear(); bytes_ = 0; }

 private:
  // The pattern covers a block's first and last 2 KiB (whole small blocks): enough to see a
  // block handed out twice, cheap enough for thousands of executions a second.
  static constexpr std::size_t edge = 2048;

  static void fill(char* p, std::size_t bytes, unsigned char v) {
    std::size_t head = std::min(bytes, edge);
    std::memset(p, v, head);
    std::memset(p + bytes - std::min(bytes - head, edge), v, std::min(bytes - head, edge));
  }

  static void verify(const char* p, const model_block& b) {
    std::size_t head = std::min(b.bytes, edge), tail = std::min(b.bytes - head, edge);
    for (std::size_t i = 0; i < head; ++i)
      if (static_cast<unsigned char>(p[i]) != b.pattern) fuzz_fail("a live block's contents changed");
    for (std::size_t i = b.bytes - tail; i < b.bytes; ++i)
      if (static_cast<unsigned char>(p[i]) != b.pattern) fuzz_fail("a live block's contents changed");
  }

  std::map<char*, model_block> live_;
  std::size_t bytes_ = 0;
  std::size_t seq_ = 0;
};

/// A size drawn mostly small, sometimes large (the shape of real traces).
inline std::size_t fuzz_size(FuzzedDataProvider& in, std::size_t max_bytes) {
  switch (in.ConsumeIntegralInRange<int>(0, 3)) {
    case 0: return in.ConsumeIntegralInRange<std::size_t>(0, 512);
    case 1: return in.ConsumeIntegralInRange<std::size_t>(0, 8192);
    case 2: return in.ConsumeIntegralInRange<std::size_t>(0, 1 << 17);
    default: return in.ConsumeIntegralInRange<std::size_t>(0, max_bytes);
  }
}

inline std::size_t fuzz_alignment(FuzzedDataProvider& in) {
  return std::size_t{1} << in.ConsumeIntegralInRange<int>(0, 14);  // 1 B .. 16 KiB
}

/// stats().live_bytes agrees with the model, and the invariants hold.
template <class R>
void check(const R& r, const model& m) {
  if constexpr (has_check_invariants<R>) r.check_invariants();
  if constexpr (has_stats<R>) {
    VRAM_FUZZ_CHECK(r.stats().live_allocations == m.size());
  }
}

}  // namespace vram::fuzz
