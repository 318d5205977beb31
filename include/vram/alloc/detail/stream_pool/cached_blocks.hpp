#pragma once
// How blocks cached in stream_pool's bins go back to its heap: every bin flushed at once
// (before growth, release and destruction), and one cached block left alone inside large
// free space placed again by best fit (docs/stream_pool.md, "Cached blocks alone inside
// large free space"). Every function: pre: the heap mutex held.

#include <cstddef>
#include <mutex>

#include <vram/alloc/detail/stream_pool/heap.hpp>
#include <vram/alloc/detail/stream_pool/lanes.hpp>
#include <vram/alloc/detail/stream_pool/size_classes.hpp>

namespace vram::detail::stream_pool {

/// The free space on a cached block's two sides, together, at which the block leaves its bin
/// (place_again_alone). Measured, not derived (docs/stream_pool.md, Limitations): at 4 MiB
/// the shared traces keep their reserved bytes and the tests' pinning trace nears best fit's.
inline constexpr std::size_t large_free = std::size_t{4} << 20;

/// The heap's record of l's stream, brought up to date: l's cached blocks were freed on it,
/// so they go back to the heap keyed to it. Pre: l's lock held too.
inline stream_info& freed_on(heap& h, lane& l) {
  stream_info& info = h.info_of(l.key);
  if (l.key != 0) info.stream = l.stream;
  return info;
}

/// Moves every cached block of every lane back to the heap.
inline void flush_lanes(heap& h, const lane_table& lanes) noexcept {
  lanes.for_each([&](lane& l) {
    if (l.cached_bytes == 0) return;
    stream_info& info = freed_on(h, l);
    for (auto& bin : l.bins) {
      for (block* b : bin) {
        l.live.erase(b->addr);
        h.free(b, info);
      }
      bin.count = 0;
    }
    l.cached_bytes = 0;
  });
}

/// Whether n is a lane's block with a free block beyond it, on the side `side` leads to.
inline bool lane_then_free(const block* n, block* block::*side) noexcept {
  return n != nullptr && n->state == block_state::lane && n->*side != nullptr && (n->*side)->state == block_state::free;
}

/// Puts lane block n, if cached, back to the heap and its bin a block of its size placed by
/// best fit in a hole smaller than large_free, if one exists (place_again_alone). A live
/// block is left to its owner.
inline void place_again(heap& h, block& n) noexcept {
  lane& l = *n.booked;  // a lane block is booked to its lane
  std::lock_guard lane_lock(l.mutex);
  if (!n.cached()) return;
  const std::size_t size = n.size;
  bin& into = l.bins[size_classes::index(size)];
  into.remove(&n);
  l.live.erase(n.addr);
  l.cached_bytes -= size;
  stream_info& info = freed_on(h, l);
  h.free(&n, info);
  block* hole = h.find_fit(info, size);  // never steals or grows for a cache
  if (hole == nullptr || hole->size >= large_free) return;
  block* b = h.carve(hole, size, size_classes::quantum);
  try {
    l.live.insert(b->addr, b);
  } catch (...) {  // no room in the lane's map: the bin holds one block fewer
    h.free(b, info);
    return;
  }
  b->state = block_state::lane;
  b->booked = &l;
  b->requested = 0;  // cached()
  into.push(b);
  l.cached_bytes += size;
}

/// After a heap free left free block f: a block cached in a bin between f and another free
/// block, the two holding large_free bytes or more, sits alone inside large free space. A
/// bin would hand that address, as it is, to the next request of its size, which may live
/// long and keep the free space on its two sides apart for good, where best fit would have
/// put it in the smallest hole. So the block goes back to the heap, where the three
/// coalesce, and its bin gets in its place a block of its size placed by best fit, when a
/// hole smaller than large_free holds one (the bin keeps its hits; a block carved from
/// large free space would only move the pin). The top block is left alone: the pool
/// flushes every bin before it takes the top, and joining free space to the top would
/// make more requests take it.
[[gnu::noinline]] inline void place_again_alone(heap& h, block* f) noexcept {
  if (h.is_wilderness(f)) return;
  block* alone[2];
  int count = 0;
  for (auto side : {&block::prev, &block::next}) {  // both looked at first: placing one again may absorb f
    block* n = f->*side;
    if (!lane_then_free(n, side)) continue;
    block* beyond = n->*side;
    if (!h.is_wilderness(beyond) && f->size + beyond->size >= large_free) alone[count++] = n;
  }
  for (int i = 0; i < count; ++i) place_again(h, *alone[i]);
}

}  // namespace vram::detail::stream_pool
