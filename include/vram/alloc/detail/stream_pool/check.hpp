#pragma once
// detail::stream_pool::check_structures: the full walk of stream_pool::check_invariants()
// (under VRAM_DEBUG): every block of the heap and of every lane, checked against the
// counters, the live maps, the bins and the ledgers. The cheap level (the counter equations)
// stays in the pool.

#include <cstddef>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>

#include <vram/core/stats.hpp>
#include <vram/alloc/detail/stream_pool/heap.hpp>
#include <vram/alloc/detail/stream_pool/lanes.hpp>

namespace vram::detail::stream_pool {

/// Throws std::logic_error naming the first broken invariant. `st` is the pool's stats()
/// under the same locks; `heap_live` the live blocks not served by a lane, `heap_ledger` the
/// ledger of those booked to no lane. Pre: the heap mutex held, and every lane (`lanes`).
inline void check_structures(const heap& h, const all_lanes_held& lanes, live_map& heap_live,
                             const ledger& heap_ledger, const vram::stats& st) {
  auto fail = [](const char* what) { throw std::logic_error(std::string("stream_pool invariant: ") + what); };
  std::size_t free_bytes = 0, free_count = 0, live_bytes = 0, live_count = 0, lane_blocks = 0;
  std::map<std::uintptr_t, const block*> heap_booked;  // heap-live blocks booked to a lane
  std::size_t heap_unbooked = 0, heap_unbooked_requested = 0;
  h.check(fail, [&](const block* b) {
    switch (b->state) {
      case block_state::free:
        ++free_count;
        free_bytes += b->size;
        break;
      case block_state::live:
        ++live_count;
        live_bytes += b->size;
        if (heap_live.find(b->addr) == nullptr) fail("live block not in the live map");
        if (b->booked != nullptr) {
          heap_booked.emplace(b->addr, b);
        } else {
          heap_unbooked += b->size;
          heap_unbooked_requested += b->requested;
        }
        break;
      case block_state::lane: ++lane_blocks; break;
    }
  });
  std::size_t lane_live = 0, lane_cached = 0;
  lanes.each([&](lane& l) {
    std::size_t booked_live = 0, booked_requested = 0;  // heap-live blocks booked to l
    for (const auto& [a, b] : heap_booked)
      if (b->booked == &l) {
        booked_live += b->size;
        booked_requested += b->requested;
      }
    lane::census c = l.check(fail, booked_live, booked_requested);
    lane_live += c.live_blocks;
    live_bytes += c.live_bytes;
    lane_cached += c.cached_blocks;
    free_bytes += c.cached_bytes;
    free_count += c.cached_blocks;
  });
  if (free_bytes != st.free_bytes || free_count != st.free_blocks) fail("free bytes or blocks disagree with the blocks");
  if (live_bytes != st.live_bytes) fail("live bytes disagree with the blocks");
  if (heap_live.size() != live_count) fail("heap live map disagrees with the blocks");
  if (heap_unbooked != heap_ledger.live || heap_unbooked_requested != heap_ledger.requested)
    fail("heap ledger disagrees with its blocks");
  if (lane_live + lane_cached != lane_blocks) fail("lanes disagree with the blocks");
}

}  // namespace vram::detail::stream_pool
