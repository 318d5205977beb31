#pragma once
// The C ABI's table of live pointers, per device: the size each was allocated with (CuPy frees
// without one), the extra streams vram_record_stream named for it, and the bytes charged
// against the memory fraction. A room of vram_c_abi.cpp, included by it alone.

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include <vram/vram_c.h>
#include <vram/detail/biased_lock.hpp>
#include <vram/detail/flat_map.hpp>

namespace {

struct live_entry {
  std::size_t size = 0;
  std::vector<vram_stream_t> streams;  // record_stream: extra streams to wait for at free
};

/// Every call takes one lock, biased to the thread that keeps allocating (no locked
/// instruction for it), over an open-addressing table (no heap node per pointer), and the
/// charge is kept under the same lock (no atomic read-modify-write for it). With a std::mutex
/// over a std::unordered_map and an atomic charge, a vram_malloc + vram_free pair took 151 ns
/// against 114 on the Intel guest (bench.c_abi, Release, minimum of 7 runs).
/// Invariant: charged() == the sum of the entries' sizes, plus the charges taken by
/// allocations not yet recorded (charge() before insert()).
class live_pointers {
 public:
  /// Charges `bytes` unless that passes `cap` (0: none); false, changing nothing, then.
  bool charge(std::size_t bytes, std::size_t cap) noexcept {
    vram::detail::biased_guard lock(lock_);
    const std::size_t now = charged_.load(std::memory_order_relaxed);
    if (cap != 0 && (now > cap || bytes > cap - now)) return false;
    charged_.store(now + bytes, std::memory_order_relaxed);
    return true;
  }
  void uncharge(std::size_t bytes) noexcept {
    vram::detail::biased_guard lock(lock_);
    charged_.store(charged_.load(std::memory_order_relaxed) - bytes, std::memory_order_relaxed);
  }

  /// Records `p` of `bytes`, charging them unless `charged_already`. Throws std::bad_alloc
  /// (no host memory for a larger table) having changed nothing.
  void insert(void* p, std::size_t bytes, bool charged_already) {
    vram::detail::biased_guard lock(lock_);
    table_.insert(key(p), live_entry{bytes, {}});
    if (!charged_already) charged_.store(charged_.load(std::memory_order_relaxed) + bytes, std::memory_order_relaxed);
  }

  enum class found { yes, foreign, wrong_size };
  /// Takes `p`'s entry out into `out` and uncharges it, when `p` is live here and `bytes` is
  /// its size (0: any); otherwise changes nothing and says why (`out.size`: the recorded size).
  found take(void* p, std::size_t bytes, live_entry& out) noexcept {
    vram::detail::biased_guard lock(lock_);
    const std::size_t slot = table_.locate(key(p));
    if (slot == table_.npos) return found::foreign;
    live_entry& e = table_.at(slot);
    if (bytes != 0 && bytes != e.size) {
      out.size = e.size;
      return found::wrong_size;
    }
    out = std::move(e);
    table_.erase_at(slot);
    charged_.store(charged_.load(std::memory_order_relaxed) - out.size, std::memory_order_relaxed);
    return found::yes;
  }

  enum class added { yes, foreign, no_memory };
  /// Adds `s` to `p`'s extra streams (once).
  added add_stream(void* p, vram_stream_t s) noexcept {
    vram::detail::biased_guard lock(lock_);
    live_entry* e = table_.find(key(p));
    if (e == nullptr) return added::foreign;
    try {
      if (std::find(e->streams.begin(), e->streams.end(), s) == e->streams.end()) e->streams.push_back(s);
    } catch (...) {
      return added::no_memory;
    }
    return added::yes;
  }

  [[nodiscard]] bool empty() noexcept {
    vram::detail::biased_guard lock(lock_);
    return table_.size() == 0;
  }
  /// Bytes charged (read without the lock: a figure for messages).
  [[nodiscard]] std::size_t charged() const noexcept { return charged_.load(std::memory_order_relaxed); }

 private:
  static std::uintptr_t key(void* p) noexcept { return reinterpret_cast<std::uintptr_t>(p); }

  vram::detail::biased_lock lock_;
  vram::detail::flat_map<live_entry> table_;
  std::atomic<std::size_t> charged_{0};  // written under lock_ only (no read-modify-write needed)
};

}  // namespace
