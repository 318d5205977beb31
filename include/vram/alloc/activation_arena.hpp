#pragma once
// vram::activation_arena: the allocator for activations — bump allocation in chunks, frees in
// (mostly) reverse order, and an O(1) reset at the end of each training step.
// One file past 650 lines because what is left here is the class's own code over one state
// (the chunk list, the top, the out-of-order frees, the steps); a chunk, which stands alone,
// is in detail/activation_arena/chunk.hpp.

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <span>
#include <utility>
#include <vector>

#include <vram/core/alignment.hpp>
#include <vram/core/concepts.hpp>
#include <vram/core/error_handler.hpp>
#include <vram/core/event.hpp>
#include <vram/core/observer.hpp>
#include <vram/core/properties.hpp>
#include <vram/core/stats.hpp>
#include <vram/core/throw.hpp>
#include <vram/alloc/detail/activation_arena/chunk.hpp>
#include <vram/source/host_source.hpp>

namespace vram {

/// Tunables of an activation_arena.
struct activation_arena_options {
  /// Bytes taken from the upstream per chunk; a request larger than this gets a chunk of its own.
  std::size_t chunk_bytes = std::size_t{64} << 20;
};

/// A position in an activation_arena, from mark(); rewind(m) frees everything allocated after it.
struct arena_mark {
  std::size_t chunk = 0;
  std::size_t offset = 0;
  std::uint64_t epoch = 0;
};

/// An arena for activations: the forward pass allocates layer after layer, the backward pass
/// frees them (mostly) in reverse, and everything is dead at the end of the step.
///
/// - Allocation bumps a pointer in the current chunk (O(1)). When it is full the arena moves
///   to its next chunk, taking one from the upstream only if it has none left; a request
///   larger than a chunk gets a chunk of its own.
/// - Frees in reverse order are O(1) and give the space back at once. Frees in any other order
///   are tolerated (O(chunks + log blocks)): the block is marked dead, and its space returns
///   when everything above it in its chunk is dead too.
/// - mark() / rewind(mark), and arena_scope (RAII), free everything allocated after a point.
/// - reset() ends a step: it bumps an epoch, so every block of the step is dead at once, and
///   keeps the chunks for the next step. When the step fitted in one chunk this is O(1) and
///   touches nothing. When it needed several chunks (the first step of a loop, typically:
///   a 62 MiB step in 16 MiB chunks takes four, 1.03x its need), reset() re-sizes: it gives
///   those chunks back and takes ONE chunk of the step's high-water (the sum of the chunks'
///   highest tops), rounded up to 1/64 of it (a power of two, so reserved/live <= 1.016),
///   never less than chunk_bytes. So the upstream is touched by the first step, by the
///   reset() that ends it, and afterwards only by a step that needs more than every step
///   before it (it takes an extra chunk, and its reset() re-sizes again): a steady training
///   loop touches it in step one and its reset() only. If the upstream cannot give the new
///   chunk, the arena is left with none and the next step takes chunks again as in step one.
///   Deallocating a pointer from before a reset is reported as misuse::use_after_reset when
///   its chunk is kept (unless its address was handed out again since: an address cannot
///   tell two steps apart), as misuse::foreign_pointer when its chunk was re-sized away,
///   and changes nothing.
///
/// Streams: an arena is bound to one stream (given at construction; stream_ref{} for
/// synchronous use). Memory is reused in that stream's order, so no synchronisation is ever
/// needed. allocate/deallocate on another stream are errors (invalid_argument / a
/// misuse::wrong_stream report). To use an arena's memory from another stream S, record an
/// event on S after S's last use and make the arena's stream wait on it
/// (`vram::event e; e.record(S); e.make_wait(arena.stream());`) before freeing, rewinding or
/// resetting. allocate_sync synchronizes the arena's stream first (the memory may have been
/// freed on it by work still in flight); deallocate_sync frees in program order.
/// Thread safety: none; like its stream, an arena is used by one thread at a time.
/// Alignment: at least default_alignment; any valid alignment (larger ones waste the gap).
/// Upstream: held by value; chunks are returned to it by release() and the destructor.
/// Zero bytes: allocate returns nullptr; deallocate(nullptr, ...) does nothing.
/// Errors: a failed request (bad argument, upstream out of memory) leaves the arena unchanged
/// and throws invalid_argument / out_of_memory. Misuse on deallocate (foreign pointer, double
/// free, wrong size, wrong stream, use after reset) is reported and changes nothing.
template <class Upstream, class Observer = no_observer>
  requires resource<Upstream>
class activation_arena : public forward_properties<activation_arena<Upstream, Observer>, Upstream> {
 public:
  explicit activation_arena(Upstream upstream, stream_ref stream = {}, activation_arena_options options = {},
                            Observer observer = {})
      : upstream_(std::move(upstream)), observer_(std::move(observer)), stream_(stream),
        chunk_bytes_(align_up(options.chunk_bytes, default_alignment)) {
    if (options.chunk_bytes == 0 || options.chunk_bytes > max_request_bytes)
      detail::throw_invalid_argument(name(), "chunk_bytes must be in (0, max_request_bytes]");
  }

  activation_arena(const activation_arena&) = delete;
  activation_arena& operator=(const activation_arena&) = delete;
  activation_arena(activation_arena&& o) noexcept
      : upstream_(std::move(o.upstream_)), observer_(std::move(o.observer_)), stream_(o.stream_),
        chunk_bytes_(o.chunk_bytes_), chunks_(take_chunks(o)), current_(std::exchange(o.current_, 0)),
        step_last_(std::exchange(o.step_last_, 0)),
        epoch_(o.epoch_), dead_(std::exchange(o.dead_, 0)),
        dead_records_(std::exchange(o.dead_records_, 0)), rising_(std::exchange(o.rising_, false)),
        stats_(std::exchange(o.stats_, {})) {
    sync_hot();
    o.sync_hot();
  }
  activation_arena& operator=(activation_arena&&) = delete;

  ~activation_arena() {
    if (live_count() != 0)
      report_misuse({misuse::live_at_destruction, name(), nullptr, live_bytes(), 0});
    for (auto& c : chunks_) give_back(c);
  }

  [[nodiscard]] static constexpr const char* name() noexcept { return "activation_arena"; }

  /// Allocates `bytes` on the arena's stream. Throws invalid_argument for a bad alignment, an
  /// absurd size or another stream; out_of_memory when the upstream cannot provide a chunk.
  [[nodiscard]] void* allocate(stream_ref s, std::size_t bytes, std::size_t align = default_alignment) {
    // The hot path: the default alignment, 0 < bytes <= max_request_bytes (one unsigned
    // compare), the arena's stream, room in the current chunk and its record. Everything
    // else, checks and errors included, is in allocate_slow.
    if (bytes - 1 < max_request_bytes && align == default_alignment && same_stream(s)) [[likely]] {
      char* const p = top_;
      // No overflow: footprint <= max_request_bytes + 255 < 2^57, and addresses are below 2^63.
      const std::uintptr_t next = reinterpret_cast<std::uintptr_t>(p) + align_up(bytes, default_alignment);
      if (next <= reinterpret_cast<std::uintptr_t>(limit_) && rec_ != rec_cap_) [[likely]] {
        *rec_++ = {p, bytes};
        top_ = reinterpret_cast<char*>(next);
        note_alloc(bytes);
        observer_.on_allocate(p, bytes, stream_);
        return p;
      }
    }
    return allocate_slow(s, bytes, align);
  }

  /// Frees a block on the arena's stream. LIFO order is O(1); any order is tolerated.
  void deallocate(stream_ref s, void* p, std::size_t bytes, std::size_t = default_alignment) noexcept {
    // The hot path: the last block of the current chunk, freed on the arena's stream with its
    // size. One compare of each record word: a dead record (and the sentinel below the first
    // block) never matches, as its tag has bit 63 set and `bytes` must not.
    if (same_stream(s)) [[likely]] {
      const auto& b = rec_[-1];
      if (b.start == p && b.tag == bytes && static_cast<std::ptrdiff_t>(bytes) >= 0) [[likely]] {
        if (rising_) settle();  // the peaks before live bytes fall (once per turn of the pattern)
        note_free(bytes);
        --rec_;
        top_ = static_cast<char*>(p);  // the block below ends at p: blocks are contiguous
        // A dead block below (or the sentinel: the chunk is empty now) is popped, its space returned.
        if (!rec_[-1].live()) [[unlikely]] {
          park();
          drop(hot_->pop_dead());
          step_back();
        }
        observer_.on_deallocate(p, bytes, stream_);
        return;
      }
    }
    deallocate_slow(s, p, bytes);
  }

  [[nodiscard]] void* allocate_sync(std::size_t bytes, std::size_t align = default_alignment) {
    synchronize(stream_);
    return allocate(stream_, bytes, align);
  }
  void deallocate_sync(void* p, std::size_t bytes, std::size_t align = default_alignment) noexcept {
    deallocate(stream_, p, bytes, align);
  }

  /// The current position; rewind(mark()) later frees everything allocated in between.
  [[nodiscard]] arena_mark mark() const noexcept {
    if (chunks_.empty()) return {0, 0, epoch_};
    return {current_, static_cast<std::size_t>(top_ - hot_->base), epoch_};
  }

  /// Frees every block allocated after `m` (and still live). O(blocks freed).
  /// Pre: blocks allocated before `m` were not freed in between (blocks allocated into their
  /// space after `m` then stay live until freed or reset: valid, but not rewound).
  /// Throws invalid_argument for a mark from before the last reset().
  void rewind(const arena_mark& m) {
    if (m.epoch != epoch_) detail::throw_invalid_argument(name(), "rewind to a mark from before a reset()");
    settle();
    if (chunks_.empty() || m.chunk > current_) return;  // everything after the mark is already free
    park();
    for (std::size_t i = current_; i > m.chunk; --i) {
      auto& c = chunks_[i];
      for (const auto& b : c.blocks) forget(b);
      c.blocks.clear();
      c.top = c.base;
    }
    current_ = m.chunk;
    auto& c = chunks_[current_];
    while (!c.blocks.empty() && c.blocks.back().start >= c.base + m.offset) {
      forget(c.blocks.back());
      c.blocks.pop_back();
    }
    drop(c.pop_dead());
    if (c.blocks.empty()) step_back();
    sync_hot();
  }

  /// Ends a step: every live block is freed. O(1) when the step used one chunk (it is kept);
  /// when it used several, they are replaced by one chunk of the step's high-water (see the
  /// class comment). Deallocating a block of the ended step afterwards is reported.
  void reset() noexcept {
    settle();
    park();
    const std::size_t used = step_last_ + 1;  // chunks 0..step_last_ were used in this step
    ++epoch_;
    stats_.requested_bytes = 0;
    dead_ = dead_records_ = 0;  // every live block is freed (live_count() is 0 with no records)
    current_ = 0;
    step_last_ = 0;
    if (used > 1 && used <= chunks_.size()) resize_to_step(used);
    if (!chunks_.empty()) chunks_[0].refresh(epoch_);
    sync_hot();
  }

  /// Gives the chunks that hold nothing live back to the upstream; returns the bytes released.
  std::size_t release() noexcept {
    settle();
    park();
    std::size_t keep = live_count() == 0 ? 0 : current_ + 1;
    std::size_t bytes = 0;
    for (std::size_t i = keep; i < chunks_.size(); ++i) {
      bytes += chunks_[i].bytes();
      give_back(chunks_[i]);
    }
    chunks_.resize(std::min(keep, chunks_.size()));
    if (chunks_.empty()) current_ = 0;
    step_last_ = std::min(step_last_, current_);
    sync_hot();
    return bytes;
  }

  /// True when `p` is the start of a live block of the current step.
  [[nodiscard]] bool owns(const void* p) const noexcept {
    for (const auto& c : chunks_) {
      if (!c.contains(p) || c.epoch != epoch_) continue;
      const std::size_t n = block_count(c);
      std::size_t i = c.find(p, n);
      return i < n && c.blocks[i].live();
    }
    return false;
  }

  /// live/requested/reserved bytes and their peaks, counts, free space. O(chunks).
  [[nodiscard]] vram::stats stats() const noexcept {
    vram::stats s = stats_;
    s.live_bytes = live_bytes();
    if (rising_) {
      s.peak_live_bytes = std::max(s.peak_live_bytes, s.live_bytes);
      s.peak_requested_bytes = std::max(s.peak_requested_bytes, s.requested_bytes);
    }
    s.live_allocations = live_count();
    s.total_deallocations = s.total_allocations - s.live_allocations;
    s.free_bytes = s.reserved_bytes - s.live_bytes;
    for_each_free_block([&](std::size_t room) {
      ++s.free_blocks;
      s.largest_free_block = std::max(s.largest_free_block, room);
    });
    return s;
  }

  /// Calls f(bytes) for each bumpable free block: the rest of the current chunk and every
  /// chunk after it (space below a top, dead or not, is not free until the top falls). O(chunks).
  template <class F>
  void for_each_free_block(F&& f) const {
    for (std::size_t i = current_; i < chunks_.size(); ++i) {
      const auto& c = chunks_[i];
      std::size_t room = c.epoch != epoch_ ? c.bytes() : &c == hot_ ? static_cast<std::size_t>(limit_ - top_) : c.room();
      if (room != 0) f(room);
    }
  }

  /// Verifies the invariants (block order, tops, live byte totals); throws std::logic_error.
  /// Full checks under VRAM_DEBUG, nothing otherwise.
  void check_invariants() const {
#if VRAM_DEBUG
    std::size_t live = 0, requested = 0, count = 0, reserved = 0, dead = 0, dead_records = 0, below = 0, below_records = 0;
    for (std::size_t i = 0; i < chunks_.size(); ++i) {
      const auto& c = chunks_[i];
      reserved += c.bytes();
      if (c.epoch != epoch_) {
        if (i <= current_) fail("a chunk at or below the current one is from an older epoch");
        continue;
      }
      if (i > current_ && !c.blocks.empty()) fail("a chunk above the current one holds blocks");
      // The current chunk's top and block count are the hot copy's.
      const char* top = &c == hot_ ? top_ : c.top;
      const detail::activation_arena::arena_block* first = c.blocks.begin();
      const detail::activation_arena::arena_block* last = first + block_count(c);
      if (top < c.base || last > first + c.blocks.capacity()) fail("the top or the record end is outside the chunk");
      const auto used = static_cast<std::size_t>(top - c.base);
      const std::size_t high = rising_ && &c == hot_ ? std::max(c.high, used) : c.high;
      if (used > high || high > c.bytes()) fail("top - base <= high <= bytes does not hold");
      if (i > step_last_ && high != 0) fail("a chunk above the step's last one was used");
      const char* prev_end = c.base;
      for (const auto& b : std::span(first, last)) {
        if (b.start != prev_end || b.requested() == 0 || b.end() > c.limit) fail("blocks are not contiguous or leave the chunk");
        if (b.gap() && (b.live() || b.requested() % default_alignment != 0)) fail("a live or unaligned gap record");
        prev_end = b.end();
        if (b.live()) live += static_cast<std::size_t>(b.end() - b.start), requested += b.requested(), ++count;
        else dead += static_cast<std::size_t>(b.end() - b.start), ++dead_records;
      }
      if (i < current_) below += used, below_records += static_cast<std::size_t>(last - first);
      if (top != prev_end) fail("top != end of the last block");
      if (last != first && !last[-1].live()) fail("a dead block on top of a chunk");
      if (first[-1].start != nullptr || first[-1].live()) fail("the sentinel below the blocks is not dead");
    }
    if (live != live_bytes() || requested != stats_.requested_bytes || count != live_count())
      fail("live totals disagree with the blocks");
    if (reserved != stats_.reserved_bytes) fail("reserved_bytes != sum of chunk sizes");
    if (!chunks_.empty() && current_ >= chunks_.size()) fail("current chunk out of range");
    if (hot_ != (chunks_.empty() ? &no_chunk_ : chunks_.data() + current_)) fail("hot_ != &chunks_[current_]");
    if (limit_ != hot_->limit || rec_cap_ != hot_->blocks.begin() + hot_->blocks.capacity())
      fail("the hot copy disagrees with the current chunk");
    if (no_chunk_.bytes() != 0 || no_chunk_.room() != 0 || !no_chunk_.blocks.empty() || no_chunk_.blocks.capacity() != 0)
      fail("no_chunk_ is not empty");
    if (current_ > step_last_ || (!chunks_.empty() && step_last_ >= chunks_.size()) || (chunks_.empty() && step_last_ != 0))
      fail("current <= step_last < chunk count does not hold");
    if (live_count() > stats_.total_allocations) fail("more live blocks than allocations");
    if (dead != dead_ || dead_records != dead_records_ || below != below_ || below_records != below_records_)
      fail("dead_, dead_records_, below_ or below_records_ disagree with the chunks");
    if (!rising_ && (live_bytes() > stats_.peak_live_bytes || stats_.requested_bytes > stats_.peak_requested_bytes))
      fail("a live total above its peak");
#endif
  }

  [[nodiscard]] stream_ref stream() const noexcept { return stream_; }
  [[nodiscard]] std::size_t chunk_bytes() const noexcept { return chunk_bytes_; }
  [[nodiscard]] std::size_t chunk_count() const noexcept { return chunks_.size(); }
  [[nodiscard]] const Upstream& upstream() const noexcept { return upstream_; }
  [[nodiscard]] Upstream& upstream() noexcept { return upstream_; }
  [[nodiscard]] Observer& observer() noexcept { return observer_; }

  friend bool operator==(const activation_arena& a, const activation_arena& b) noexcept { return &a == &b; }

 private:
  [[noreturn]] static void fail(const char* what) { throw std::logic_error(std::string("activation_arena: ") + what); }

  /// True for the arena's stream: one branch for the two words of a stream_ref.
  [[nodiscard]] bool same_stream(stream_ref s) const noexcept {
    return ((reinterpret_cast<std::uintptr_t>(s.cuda()) ^ reinterpret_cast<std::uintptr_t>(stream_.cuda())) |
            (static_cast<unsigned>(s.type()) ^ static_cast<unsigned>(stream_.type()))) == 0;
  }

  /// Bumps `bytes` into `c` at any valid alignment, or returns nullptr when it does not fit.
  /// A gap left below the block by a larger alignment is recorded as a dead gap record, so
  /// the blocks stay contiguous. May throw bad_alloc (growing the record), nothing changed.
  void* bump(detail::activation_arena::arena_chunk& c, std::size_t bytes, std::size_t footprint, std::size_t align) {
    const std::size_t gap = align_up(reinterpret_cast<std::uintptr_t>(c.top), align) - reinterpret_cast<std::uintptr_t>(c.top);
    if (gap > c.room() || c.room() - gap < footprint) return nullptr;
    c.blocks.reserve_more(gap != 0 ? 2 : 1);
    if (gap != 0) {
      c.blocks.push_unchecked({c.top, detail::activation_arena::arena_block::dead_bit | detail::activation_arena::arena_block::gap_bit | gap});
      dead_ += gap;
      ++dead_records_;
    }
    char* p = c.top + gap;
    c.blocks.push_unchecked({p, bytes});
    c.top = p + footprint;
    note_alloc(bytes);
    observer_.on_allocate(p, bytes, stream_);
    return p;
  }

  /// Everything allocate()'s hot path does not take: argument checks and errors, zero bytes,
  /// larger alignments, a full current chunk (move to the next one, or take a new one).
  [[gnu::noinline]] void* allocate_slow(stream_ref s, std::size_t bytes, std::size_t align) {
    detail::check_request(name(), bytes, align);
    if (!same_stream(s)) [[unlikely]]
      detail::throw_invalid_argument(name(), "allocate on a stream other than the arena's (see the class comment)");
    if (bytes == 0) return nullptr;
    park();
    void* p = bump_or_grow(bytes, align);
    sync_hot();
    return p;
  }

  /// allocate_slow with its arguments checked, the arena parked: bumps into the current
  /// chunk, the next one, or a new one. Throws with nothing changed.
  void* bump_or_grow(std::size_t bytes, std::size_t align) {
    settle();  // this may move to another chunk
    const std::size_t footprint = align_up(bytes, default_alignment);
    if (!chunks_.empty()) {
      if (void* p = bump(chunks_[current_], bytes, footprint, align)) return p;
    }
    std::size_t next = chunks_.empty() ? 0 : current_ + 1;
    if (next < chunks_.size()) {
      chunks_[next].refresh(epoch_);
      if (void* p = bump(chunks_[next], bytes, footprint, align)) {
        current_ = next;
        step_last_ = std::max(step_last_, next);
        sync_hot();
        return p;
      }
    }
    // A new chunk, inserted at `next` so that spare chunks stay for later in the step.
    std::size_t need = footprint + (align > default_alignment ? align - default_alignment : 0);
    std::size_t size = std::max(chunk_bytes_, need);
    void* base = nullptr;
    try {
      base = upstream_.allocate(stream_, size, default_alignment);
    } catch (const out_of_memory&) {
      ++stats_.ooms;
      observer_.on_out_of_memory(bytes, stream_, stats());
      detail::throw_out_of_memory(name(), bytes, stream_, stats());
    }
    try {
      detail::activation_arena::arena_chunk c;
      c.base = c.top = static_cast<char*>(base);
      c.limit = c.base + size;
      c.epoch = c.born = epoch_;
      c.blocks.reserve(16);
      chunks_.insert(chunks_.begin() + static_cast<std::ptrdiff_t>(next), std::move(c));
    } catch (...) {
      upstream_.deallocate(stream_, base, size, default_alignment);
      throw;
    }
    stats_.reserved_bytes += size;
    stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
    ++stats_.upstream_allocations;
    observer_.on_grow(base, size);
    void* p = bump(chunks_[next], bytes, footprint, align);  // fits by construction; reserve(16) so no throw
    current_ = next;
    // A chunk inserted below the highest used one shifts it up by one.
    step_last_ = next > step_last_ ? next : (chunks_.size() > 1 ? step_last_ + 1 : 0);
    sync_hot();
    return p;
  }

  /// reset() after a step that used chunks [0, used): gives them (and any spare chunk) back
  /// and takes one chunk of the step's high-water, rounded up to a power-of-two granule of at
  /// most 1/64 of it. Pre: every chunk is empty for the new epoch. If the upstream fails, no
  /// chunk is left (the next step takes chunks as the first did).
  void resize_to_step(std::size_t used) noexcept {
    std::size_t high = 0;
    for (std::size_t i = 0; i < used; ++i) high += chunks_[i].high;
    const std::size_t granule = std::max(default_alignment, std::bit_floor(high) >> 6);
    const std::size_t size = std::max(chunk_bytes_, align_up(high, granule));
    // Keep chunk 0's record (and its block capacity), with the largest capacity moved into it.
    for (std::size_t i = 1; i < used; ++i)
      if (chunks_[i].blocks.capacity() > chunks_[0].blocks.capacity()) std::swap(chunks_[0].blocks, chunks_[i].blocks);
    for (auto& c : chunks_) give_back(c);
    chunks_.erase(chunks_.begin() + 1, chunks_.end());
    auto& c = chunks_[0];
    void* base = nullptr;
    try {
      base = upstream_.allocate(stream_, size, default_alignment);
    } catch (...) {  // out of memory or an upstream error: no chunk; the next step takes chunks again
      chunks_.clear();
      return;
    }
    c.base = c.top = static_cast<char*>(base);
    c.limit = c.base + size;
    c.high = 0;
    c.blocks.clear();
    c.epoch = epoch_;
    c.born = epoch_ - 1;  // taken by the reset that ended step epoch_ - 1 (its pointers are use_after_reset)
    stats_.reserved_bytes += size;
    stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
    ++stats_.upstream_allocations;
    observer_.on_grow(base, size);
  }

  /// Everything deallocate()'s hot path does not take: nullptr, another stream, a block that
  /// is not the current chunk's last (out of order), misuse.
  [[gnu::noinline]] void deallocate_slow(stream_ref s, void* p, std::size_t bytes) noexcept {
    if (p == nullptr) return;
    if (!same_stream(s)) {
      report_misuse({misuse::wrong_stream, name(), p, bytes, 0});
      return;
    }
    settle();
    park();
    // Search recent chunks first: out-of-order frees are usually near the top.
    std::size_t i = chunks_.size();
    for (std::size_t k = 0; k < chunks_.size(); ++k) {
      std::size_t idx = (current_ + chunks_.size() - k) % chunks_.size();
      if (chunks_[idx].contains(p)) {
        i = idx;
        break;
      }
    }
    if (i == chunks_.size()) {
      report_misuse({misuse::foreign_pointer, name(), p, bytes, 0});
      return;
    }
    auto& c = chunks_[i];
    if (c.epoch != epoch_) {
      report_misuse({misuse::use_after_reset, name(), p, bytes, 0});
      return;
    }
    std::size_t k = c.find(p);
    if (k == c.blocks.size() || c.blocks[k].gap()) {
      // Not a block of this step. Above the top but below the step's high-water, the address
      // was handed out in this step and its space came back: a second free (an address cannot
      // tell two steps apart, so this holds in a chunk kept through a reset too). Otherwise, in
      // a chunk that lived through a reset it is most likely a pointer of an ended step; in a
      // chunk of this step, an interior pointer or one never handed out.
      const bool freed_this_step = static_cast<char*>(p) >= c.top && static_cast<char*>(p) < c.base + c.high;
      misuse kind = freed_this_step ? misuse::double_free
                    : c.born != epoch_ ? misuse::use_after_reset
                                       : misuse::foreign_pointer;
      report_misuse({kind, name(), p, bytes, 0});
      return;
    }
    auto& b = c.blocks[k];
    if (!b.live()) {
      report_misuse({misuse::double_free, name(), p, bytes, 0});
      return;
    }
    if (b.requested() != bytes) {
      report_misuse({misuse::wrong_size, name(), p, bytes, b.requested()});
      return;
    }
    note_free(bytes);
    b.kill();
    dead_ += static_cast<std::size_t>(b.end() - b.start);
    ++dead_records_;
    if (k + 1 == c.blocks.size()) {
      drop(c.pop_dead());
      if (i == current_ && c.blocks.empty()) step_back();
    }
    sync_hot();  // the current chunk's top, or a lower one's (below_), may have fallen
    observer_.on_deallocate(p, bytes, stream_);
  }

  // The counters the hot path keeps: requested bytes and total_allocations. live_bytes,
  // live_allocations and total_deallocations are derived from the records (live_bytes(),
  // live_count()); the peaks are settled at turns.
  void note_alloc(std::size_t bytes) noexcept {
    stats_.requested_bytes += bytes;
    ++stats_.total_allocations;
    rising_ = true;  // peaks and the chunk's high-water are brought up to date by settle()
  }

  /// Brings the peaks and the current chunk's high-water up to date. Allocation only raises
  /// live bytes and the current top, so both maxima are reached just before something lowers
  /// them, moves to another chunk or reads them: each of those settles first.
  void settle() noexcept {
    if (!rising_) return;
    hot_->high = std::max(hot_->high, static_cast<std::size_t>(top_ - hot_->base));
    stats_.peak_live_bytes = std::max(stats_.peak_live_bytes, live_bytes());
    stats_.peak_requested_bytes = std::max(stats_.peak_requested_bytes, stats_.requested_bytes);
    rising_ = false;
  }
  void note_free(std::size_t requested) noexcept {
    stats_.requested_bytes -= requested;
  }
  /// A record dropped by rewind(): a live block is freed, a dead one leaves the dead totals.
  void forget(const detail::activation_arena::arena_block& b) noexcept {
    if (b.live()) note_free(b.requested());
    else drop({static_cast<std::size_t>(b.end() - b.start), 1});
  }
  /// Dead records popped off a chunk leave the dead totals.
  void drop(detail::activation_arena::dead_run d) noexcept {
    dead_ -= d.bytes;
    dead_records_ -= d.records;
  }
  static std::vector<detail::activation_arena::arena_chunk> take_chunks(activation_arena& o) noexcept {
    o.park();
    return std::exchange(o.chunks_, {});
  }
  /// The live blocks: the records of the step's chunks less the dead ones. O(1).
  [[nodiscard]] std::size_t live_count() const noexcept {
    return below_records_ + static_cast<std::size_t>(rec_ - hot_->blocks.begin()) - dead_records_;
  }
  /// Blocks are contiguous from each chunk's base, so the live footprints are the used bytes
  /// of the step's chunks less the dead records': O(1), with nothing kept on the hot path.
  [[nodiscard]] std::size_t live_bytes() const noexcept { return below_ + static_cast<std::size_t>(top_ - hot_->base) - dead_; }

  /// The current chunk is empty: continue in the highest chunk below it that holds blocks, so
  /// their free tops are bumped into again.
  void step_back() noexcept {
    while (current_ > 0 && chunks_[current_].blocks.empty()) --current_;
    sync_hot();
  }

  /// Writes the hot copy back into the current chunk, so that the rest of the code reads one
  /// place: before anything but the hot paths and the const members (which read the hot copy
  /// for the current chunk: block_count(), top_) reads or changes a chunk.
  void park() noexcept {
    hot_->top = top_;
    hot_->blocks.set_end(rec_);
  }

  /// The blocks of `c`, parked or not.
  [[nodiscard]] std::size_t block_count(const detail::activation_arena::arena_chunk& c) const noexcept {
    return &c == hot_ ? static_cast<std::size_t>(rec_ - c.blocks.begin()) : c.blocks.size();
  }

  /// Re-points hot_ at the current chunk, reloads the hot copy from it and recomputes below_;
  /// after every change of current_, of chunks_, or of a parked chunk. O(current_).
  void sync_hot() noexcept {
    hot_ = chunks_.empty() ? &no_chunk_ : chunks_.data() + current_;
    top_ = hot_->top;
    limit_ = hot_->limit;
    rec_ = hot_->blocks.end_ptr();
    rec_cap_ = hot_->blocks.cap_ptr();
    below_ = below_records_ = 0;
    for (std::size_t i = 0; i < current_ && i < chunks_.size(); ++i) {
      below_ += chunks_[i].used();
      below_records_ += chunks_[i].blocks.size();
    }
  }

  void give_back(detail::activation_arena::arena_chunk& c) noexcept {
    if (c.base == nullptr) return;
    observer_.on_release(c.base, c.bytes());
    upstream_.deallocate(stream_, c.base, c.bytes(), default_alignment);
    stats_.reserved_bytes -= c.bytes();
    ++stats_.upstream_deallocations;
    c.base = nullptr;
  }

  [[no_unique_address]] Upstream upstream_;
  [[no_unique_address]] Observer observer_;
  stream_ref stream_;
  std::size_t chunk_bytes_;
  std::vector<detail::activation_arena::arena_chunk> chunks_;  // in the order a step uses them
  std::size_t current_ = 0;                  // the chunk being bumped; chunks above it hold nothing live
  // == chunks_.empty() ? &no_chunk_ : &chunks_[current_], never null (no_chunk_ has no room
  // and no blocks, so both hot paths fall through to the slow ones).
  detail::activation_arena::arena_chunk no_chunk_{};
  detail::activation_arena::arena_chunk* hot_ = &no_chunk_;
  // The current chunk's bump state, kept in the arena itself so the hot paths read it with no
  // load of hot_ first. It is the truth for the current chunk: hot_->top and hot_->blocks'
  // end are stale until park() writes these back, and sync_hot() reloads them (const members
  // read these instead, so they write nothing).
  //   top_ == hot_->top (parked), limit_ == hot_->limit, [begin, rec_) == hot_->blocks (parked),
  //   rec_cap_ == the end of its capacity
  char* top_ = nullptr;
  char* limit_ = nullptr;
  detail::activation_arena::arena_block* rec_ = no_chunk_.blocks.end_ptr();
  detail::activation_arena::arena_block* rec_cap_ = rec_;
  std::size_t step_last_ = 0;                // the highest chunk used in this step (current_ <= step_last_)
  std::uint64_t epoch_ = 0;                  // the step; bumped by reset()
  // live bytes == below_ + hot_->used() - dead_ (blocks are contiguous from each chunk's base),
  // live blocks == below_records_ + hot_->blocks.size() - dead_records_:
  std::size_t below_ = 0;          // == sum of chunks_[i].used() for i < current_
  std::size_t below_records_ = 0;  // == sum of chunks_[i].blocks.size() for i < current_
  std::size_t dead_ = 0;           // == sum of the footprints of dead records (out-of-order frees, gaps) in this step
  std::size_t dead_records_ = 0;   // == the number of those records
  // Allocations since the last settle(): then peak_* may be below the live totals and the
  // current chunk's high below its top (stats() and check_invariants() allow for it).
  bool rising_ = false;
  // reserved_bytes == sum of chunk bytes; requested_bytes == sum of live requests
  // (stats_.live_bytes, live_allocations and total_deallocations are not kept: stats()
  // derives them)
  vram::stats stats_{};
};

static_assert(resource<activation_arena<host_source>>);

/// Rewinds an activation_arena to where it was when the scope began (RAII).
template <class Arena>
class arena_scope {
 public:
  explicit arena_scope(Arena& arena) noexcept : arena_(arena), mark_(arena.mark()) {}
  arena_scope(const arena_scope&) = delete;
  arena_scope& operator=(const arena_scope&) = delete;
  ~arena_scope() {
    try {
      arena_.rewind(mark_);
    } catch (...) {  // the arena was reset inside the scope: nothing left to rewind
    }
  }
  [[nodiscard]] const arena_mark& mark() const noexcept { return mark_; }

 private:
  Arena& arena_;
  arena_mark mark_;
};

}  // namespace vram
