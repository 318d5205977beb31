#pragma once
// detail::stream_pool::find_stranding: at an out-of-memory, the free memory that other
// streams' queued work keeps in pieces. A free block keyed to stream S joins its neighbours
// only when merge_idle_streams sees S's marker complete, so while S has work queued the heap
// may hold a run of address-adjacent free blocks that would serve the request merged, in
// pieces no single stream can take. Cold path (the pool is about to throw): one walk over
// every block, O(blocks + streams).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <new>
#include <unordered_map>
#include <vector>

#include <vram/core/error.hpp>
#include <vram/alloc/detail/stream_pool/heap.hpp>

namespace vram::detail::stream_pool {

/// The stranding of a request needing `need` bytes (alignment slack included) on the stream
/// keyed `own`: the streams other than `own` and key 0 with a free block inside a run of
/// adjacent free blocks (stream keys ignored, within one chunk) of at least `need` bytes,
/// each with all its free bytes and its largest free block, most bytes first; and the
/// largest run. No stream when no such run exists (the request would not fit merged either)
/// or when the walk finds no host memory for its tallies (the error then says less, rather
/// than failing differently). Pre: the heap mutex held, after merge_idle_streams (a block
/// still keyed to a stream then waits for that stream's queued work).
inline stream_stranding find_stranding(const heap& h, std::uintptr_t own, std::size_t need) noexcept {
  stream_stranding out;
  struct tally {
    std::uintptr_t key;
    std::size_t free_bytes = 0, largest_block = 0;
    bool in_run = false;  // has a block in a run of at least `need` bytes
  };
  try {
    std::unordered_map<const stream_info*, tally> streams;  // the streams that may strand: not own, not 0
    h.for_each_stream([&](std::uintptr_t key, const stream_info& info) {
      if (key != 0 && key != own && !info.index.empty()) streams.emplace(&info, tally{key});
    });
    if (streams.empty()) return out;
    for (const auto& [addr, c] : h.chunks()) {
      const block* run = nullptr;  // the first block of the current run of free blocks
      std::size_t run_bytes = 0;
      auto close_run = [&](const block* end) {  // [run, end) is a run of free blocks
        out.largest_run = std::max(out.largest_run, run_bytes);
        if (run_bytes >= need)
          for (const block* b = run; b != end; b = b->next)
            if (auto it = streams.find(b->stream); it != streams.end()) it->second.in_run = true;
        run = nullptr;
        run_bytes = 0;
      };
      for (const block* b = c->first; b != nullptr; b = b->next) {
        if (b->state != block_state::free) {  // live, or a lane's (cached in a bin or live)
          if (run != nullptr) close_run(b);
          continue;
        }
        if (run == nullptr) run = b;
        run_bytes += b->size;
        if (auto it = streams.find(b->stream); it != streams.end()) {
          it->second.free_bytes += b->size;
          it->second.largest_block = std::max(it->second.largest_block, b->size);
        }
      }
      if (run != nullptr) close_run(nullptr);
    }
    std::vector<tally> stranding;
    for (const auto& [info, t] : streams)
      if (t.in_run) stranding.push_back(t);
    // Most bytes first, then by key: the same state always reads the same.
    std::sort(stranding.begin(), stranding.end(), [](const tally& a, const tally& b) {
      return a.free_bytes != b.free_bytes ? a.free_bytes > b.free_bytes : a.key < b.key;
    });
    out.streams = stranding.size();
    for (const tally& t : stranding) {
      out.bytes += t.free_bytes;
      if (out.listed < stream_stranding::max_listed) out.stream[out.listed++] = {t.key, t.free_bytes, t.largest_block};
    }
  } catch (const std::bad_alloc&) {
    return stream_stranding{};
  }
  return out;
}

}  // namespace vram::detail::stream_pool
