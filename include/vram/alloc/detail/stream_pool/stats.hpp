#pragma once
// detail::stream_pool::collect_stats: stream_pool::stats() from its ledgers (the heap's and
// every lane's) and its heap, with the bounds that make the peaks of several ledgers an
// upper bound (the class comment, "Statistics").

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include <vram/core/stats.hpp>
#include <vram/alloc/detail/stream_pool/heap.hpp>
#include <vram/alloc/detail/stream_pool/lanes.hpp>

namespace vram::detail::stream_pool {

/// The figures, with `each_lane(f)` calling f on every lane under its lock; `heap_ledger` the
/// ledger of the heap-live blocks booked to no lane. Pre: the heap mutex held.
template <class EachLane>
vram::stats collect_stats(const heap& h, const ledger& heap_ledger, std::size_t ooms, EachLane&& each_lane) {
  vram::stats st;
  st.live_bytes = heap_ledger.live;
  st.requested_bytes = heap_ledger.requested;
  std::size_t peak_live = heap_ledger.peak_live;
  std::size_t peak_requested = heap_ledger.peak_requested;
  st.reserved_bytes = h.reserved();
  st.peak_reserved_bytes = h.peak_reserved();
  st.total_allocations = heap_ledger.allocations;
  st.total_deallocations = heap_ledger.deallocations;
  h.for_each_stream([&](std::uintptr_t, const stream_info& info) {
    st.free_blocks += info.index.size();
    if (const block* b = info.index.largest()) st.largest_free_block = std::max(st.largest_free_block, b->size);
  });
  each_lane([&](lane& l) { l.add_to(st, peak_live, peak_requested); });
  // Every reserved byte is live or free (in an index or a bin): the free bytes need no counter.
  st.free_bytes = st.reserved_bytes - st.live_bytes;
  // Peaks: the sum of the ledgers' peaks bounds the true peak from above, and is exact when
  // one ledger was ever used (one stream). The reserved peak bounds the live peak too, and
  // the live peak the requested one (a block is never smaller than its request).
  st.peak_live_bytes = std::max(st.live_bytes, std::min(peak_live, st.peak_reserved_bytes));
  st.peak_requested_bytes = std::max(st.requested_bytes, std::min(peak_requested, st.peak_live_bytes));
  st.live_allocations = st.total_allocations - st.total_deallocations;
  st.upstream_allocations = h.upstream_allocations();
  st.upstream_deallocations = h.upstream_deallocations();
  st.ooms = ooms;
  return st;
}

}  // namespace vram::detail::stream_pool
