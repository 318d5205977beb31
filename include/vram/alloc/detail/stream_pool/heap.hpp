#pragma once
// detail::stream_pool::heap: stream_pool's best-fit heap. The blocks of the chunks the pool
// holds from its upstream, linked in address order; the free ones indexed per stream key;
// best fit, coalescing, splitting (carve), growth by a range the pool took from its
// upstream, and release (whole chunks, or granule-aligned holes cut out of a contiguous
// range). It knows nothing of the upstream's type, of lanes or of observers: the pool hands
// it ranges and takes ranges back through callbacks, and all of it runs under the pool's
// heap mutex.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include <vram/core/alignment.hpp>
#include <vram/alloc/detail/stream_pool/free_index.hpp>
#include <vram/alloc/detail/stream_pool/size_classes.hpp>
#include <vram/alloc/detail/stream_pool/stream_marker.hpp>

namespace vram::detail::stream_pool {

struct chunk;
struct lane;
struct stream_info;

// A lane-owned block (in a bin or in a lane's live map) is `lane` either way: the heap reads
// neighbours' states under its own mutex, so lanes never write the state on their path.
enum class block_state : std::uint8_t { free, live, lane };

/// A block of a chunk, host-side. Within a chunk, blocks are linked in address order and
/// tile it: first->addr == chunk.addr, b->addr + b->size == b->next->addr.
struct block {
  std::uintptr_t addr = 0;
  std::size_t size = 0;
  std::size_t requested = 0;  // live: what the caller asked for (never 0); a lane's block in a bin: 0
  block* prev = nullptr;
  block* next = nullptr;      // also links spare nodes
  chunk* owner = nullptr;
  stream_info* stream = nullptr;  // free: the stream it is reusable on (the heap's any_stream(): any); its index lists it
  std::uint64_t epoch = 0;    // free: the stream's free counter when it was freed
  block_state state = block_state::free;
  std::uint32_t free_class = 0;  // free: its class in the index (set and read by the index)
  lane* booked = nullptr;     // live: whose ledger counts it (a lane-owned block: its lane; nullptr: the heap's)
  block* free_prev = nullptr;  // free: links of its stream key's best-fit index
  block* free_next = nullptr;

  /// A lane's block cached in a bin: its `requested` is 0, which no live block has, so a bin
  /// hit or a cached free writes no flag of its own. Under the lane's lock.
  [[nodiscard]] bool cached() const noexcept { return requested == 0; }
};

/// A range held from the upstream (with a contiguous upstream, adjacent ranges are one chunk).
struct chunk {
  std::uintptr_t addr;
  std::size_t size;
  block* first;
  block* last;
};

/// What the heap knows about a stream that freed blocks.
struct stream_info {
  freeing_stream stream;
  free_index<block> index;       // its free blocks (key 0: usable by every stream)
  std::uint64_t epoch = 0;       // incremented per free on this stream
  std::optional<stream_marker> pending;  // recorded at steal or merge time
  std::uint64_t pending_epoch = 0;       // blocks with epoch <= this precede `pending`
};

/// Thread safety: none; the pool calls every member under its heap mutex.
/// Invariants: reserved() == the sum of the chunks' sizes; every free block is in the index
/// of its stream key and nowhere else; no two adjacent free blocks share a key (they
/// coalesce at once); with a contiguous upstream no two chunks touch (they merge).
/// Complexity (k: the blocks of the size class concerned, at most free_index::walk_limit
/// walked, O(log k) beyond; see free_index): best fit in two indexes (the stream's own and
/// key 0's); a free one index insert plus O(1) coalescing (each absorbed neighbour an erase);
/// steal and merging visit every stream that holds free blocks, O(s) (bench.pool_worst_case:
/// 63 such streams cost about 0.5 us per steal); growth O(log chunks); release O(free blocks
/// of key 0 + blocks of the chunks it cuts).
class heap {
  static constexpr std::size_t quantum = size_classes::quantum;

 public:
  /// `contiguous`: the upstream grows in place (adjacent ranges merge into one chunk);
  /// `granularity`: the upstream's page, to which growth and release round.
  heap(bool contiguous, std::size_t granularity) : contiguous_(contiguous), granularity_(granularity) {
    info0_ = &streams_[0];  // present from the start: merging iterates streams_ while keying blocks to 0
  }
  heap(const heap&) = delete;
  heap& operator=(const heap&) = delete;
  /// Frees the host-side nodes (the pool gives the memory back first, with clear()).
  ~heap() {
    for (auto& [addr, c] : chunks_) {
      for (block* b = c->first; b != nullptr;) delete std::exchange(b, b->next);
      delete c;
    }
    while (spare_ != nullptr) delete std::exchange(spare_, spare_->next);
  }

  [[nodiscard]] bool contiguous() const noexcept { return contiguous_; }
  [[nodiscard]] std::size_t granularity() const noexcept { return granularity_; }
  [[nodiscard]] std::size_t reserved() const noexcept { return reserved_; }
  [[nodiscard]] std::size_t peak_reserved() const noexcept { return peak_reserved_; }
  [[nodiscard]] std::size_t upstream_allocations() const noexcept { return upstream_allocations_; }
  [[nodiscard]] std::size_t upstream_deallocations() const noexcept { return upstream_deallocations_; }
  [[nodiscard]] const std::map<std::uintptr_t, chunk*>& chunks() const noexcept { return chunks_; }

  /// The free blocks usable by every stream (key 0: fresh memory, and blocks whose stream's
  /// work is known complete).
  [[nodiscard]] stream_info& any_stream() noexcept { return *info0_; }
  /// streams_[key], remembering the last key looked up (unordered_map nodes are stable).
  stream_info& info_of(std::uintptr_t key) {
    if (key == 0) return *info0_;
    if (key != last_info_key_ || last_info_ == nullptr) {
      last_info_ = &streams_[key];
      last_info_key_ = key;
    }
    return *last_info_;
  }
  /// f(key, info) for every stream record (key 0 included).
  template <class F>
  void for_each_stream(F&& f) const {
    for (const auto& [key, info] : streams_) f(key, info);
  }
  template <class F>
  void for_each_stream(F&& f) {
    for (auto& [key, info] : streams_) f(key, info);
  }

  // ---- allocation ---------------------------------------------------------------------

  /// The smallest adequate block usable on `stream` without waiting (its own or global).
  block* find_fit(const stream_info& stream, std::size_t need) {
    block* any = fit(*info0_, need);
    if (&stream == info0_) return any;
    block* own = fit(stream, need);
    if (own == nullptr || any == nullptr) return own != nullptr ? own : any;
    // As if one index held both: the smaller block wins, then the lower address; the
    // wilderness loses to any other block.
    bool own_first = is_wilderness(own) != is_wilderness(any)
                         ? !is_wilderness(own)
                         : (own->size != any->size ? own->size < any->size : own->addr < any->addr);
    return own_first ? own : any;
  }

  /// The free block at the top of the highest chunk, with a contiguous upstream: taken last.
  [[nodiscard]] bool is_wilderness(const block* b) const noexcept { return contiguous_ && b == top_->last; }

  /// The smallest adequate block of another stream, and a marker the caller must wait on.
  block* steal(std::uintptr_t key, std::size_t need, std::optional<stream_marker>& wait_on) {
    block* best = nullptr;
    for (auto& [k, info] : streams_) {
      if (k == key || k == 0 || info.index.empty()) continue;
      block* b = fit(info, need);
      if (b != nullptr && (best == nullptr || b->size < best->size)) best = b;
    }
    if (best == nullptr) return nullptr;
    auto& info = *best->stream;
    if (!info.pending || best->epoch > info.pending_epoch) {
      info.pending = info.stream.record();
      info.pending_epoch = info.epoch;
    }
    wait_on = info.pending;
    return best;
  }

  /// True when a stream other than `key` holds free blocks (merging blocks of `key` itself
  /// cannot give a request on `key` anything: they are already usable on it and coalesce
  /// with the key-0 memory around them).
  [[nodiscard]] bool others_hold_free(std::uintptr_t key) const noexcept {
    for (const auto& [k, info] : streams_)
      if (k != 0 && k != key && !info.index.empty()) return true;
    return false;
  }

  /// For each stream holding free blocks: record a marker if none is pending; when the
  /// pending marker is complete, re-key the blocks freed before it to "any stream".
  void merge_idle_streams() {
    for (auto& [k, info] : streams_) {
      // Two rounds: an old marker may cover only some blocks; a fresh one covers the rest.
      for (int round = 0; round < 2 && k != 0 && !info.index.empty(); ++round) {
        if (!info.pending) {
          info.pending = info.stream.record();
          info.pending_epoch = info.epoch;
        }
        if (!info.pending->query()) break;
        std::vector<block*> ready;
        std::uint64_t before = info.pending_epoch;  // (a structured binding: not capturable before C++20's fix in clang 16)
        info.index.for_each([&](block* b) {
          if (b->epoch <= before) ready.push_back(b);
        });
        info.pending.reset();
        for (block* b : ready) {  // only key-0 neighbours join: blocks still keyed k wait their turn
          index_erase(b);
          b->stream = info0_;
          index_insert(coalesce(b, false));
        }
      }
    }
  }

  /// Splits `size` bytes at `align` out of free block b; the rest stays free with b's key.
  /// The returned block is out of the free structures, marked live; the caller sets its state.
  block* carve(block* b, std::size_t size, std::size_t align) {
    index_erase(b);
    std::uintptr_t start = align_up(b->addr, align);
    if (start != b->addr) {  // keep the front as a free block
      block* rest = split(b, start - b->addr);
      rest->state = block_state::live;
      index_insert(b);
      b = rest;
    }
    b->state = block_state::live;  // out of the free structures until the caller sets the state
    if (b->size - size >= quantum) index_insert(split(b, size));
    return b;
  }

  /// Returns b to the free index of `info`'s stream, coalescing; returns the free block that
  /// holds it now (b, or the neighbour that absorbed it).
  block* free(block* b, stream_info& info) noexcept {
    b->stream = &info;
    b->epoch = ++info.epoch;
    b->state = block_state::free;
    block* survivor = coalesce(b);
    index_insert(survivor);
    return survivor;
  }

  // ---- growth and release -------------------------------------------------------------

  /// With a contiguous upstream: the free block at the top of the highest chunk when it is
  /// usable on `own` and smaller than `need` (in-place growth only needs to top it up), else
  /// nullptr.
  [[nodiscard]] block* top_to_extend(const stream_info& own, std::size_t need) const noexcept {
    if (!contiguous_ || chunks_.empty()) return nullptr;
    block* top = top_->last;
    bool usable = top->stream == info0_ || top->stream == &own;
    return top->state == block_state::free && usable && top->size < need ? top : nullptr;
  }

  /// Adds [p, p + bytes), which `allocate(bytes)` takes from the upstream, as one free block
  /// keyed to `stream`; merges it into adjacent chunks when the upstream is contiguous.
  /// Throws what `allocate` throws (nothing changed).
  template <class Allocate>
  void grow_by(std::size_t bytes, stream_info& stream, Allocate&& allocate) {
    block* nb = new_block();  // before the upstream call: a failure here leaks nothing
    void* p;
    try {
      p = allocate(bytes);
    } catch (...) {
      delete_block(nb);
      throw;
    }
    auto addr = reinterpret_cast<std::uintptr_t>(p);
    nb->addr = addr;
    nb->size = bytes;
    nb->stream = &stream;
    nb->epoch = &stream != info0_ ? stream.epoch : 0;
    chunk* c = nullptr;
    if (contiguous_) {
      auto after = chunks_.lower_bound(addr);
      if (after != chunks_.begin()) {
        chunk* before = std::prev(after)->second;
        if (before->addr + before->size == addr) {  // extend the chunk below
          c = before;
          c->last->next = nb;
          nb->prev = c->last;
          c->last = nb;
          c->size += bytes;
        }
      }
      if (c == nullptr) {
        c = new chunk{addr, bytes, nb, nb};
        after = chunks_.emplace_hint(after, addr, c);
        ++after;
      }
      if (after != chunks_.end() && after->first == addr + bytes) {  // absorb the chunk above
        chunk* above = after->second;
        for (block* b = above->first; b != nullptr; b = b->next) b->owner = c;
        c->last->next = above->first;
        above->first->prev = c->last;
        c->last = above->last;
        c->size += above->size;
        chunks_.erase(after);
        delete above;
      }
    } else {
      c = new chunk{addr, bytes, nb, nb};
      chunks_.emplace(addr, c);
    }
    nb->owner = c;
    chunks_changed();
    reserved_ += bytes;
    peak_reserved_ = std::max(peak_reserved_, reserved_);
    ++upstream_allocations_;
    index_insert(coalesce(nb));
  }

  /// Gives back, through `give_back(addr, bytes)`, whole free chunks of key 0 and (with a
  /// contiguous upstream) every granule-aligned free piece of key 0; returns the bytes.
  template <class GiveBack>
  std::size_t release(GiveBack&& give_back) {
    std::vector<block*> candidates;
    info0_->index.for_each([&](block* b) { candidates.push_back(b); });
    std::size_t released = 0;
    for (block* b : candidates) {
      chunk* c = b->owner;
      if (!contiguous_) {
        if (c->first != b || c->last != b) continue;
        index_erase(b);
        chunks_.erase(c->addr);
        chunks_changed();
        returned(c->addr, c->size, give_back);
        released += c->size;
        delete_block(b);
        delete c;
        continue;
      }
      std::uintptr_t lo = align_up(b->addr, granularity_), hi = align_down(b->addr + b->size, granularity_);
      if (hi <= lo) continue;
      released += hi - lo;
      cut(b, lo, hi, give_back);
    }
    return released;
  }

  /// Gives every chunk back through `give_back(addr, bytes)` and forgets every block.
  template <class GiveBack>
  void clear(GiveBack&& give_back) noexcept {
    for (auto& [addr, c] : chunks_) {
      for (block* b = c->first; b != nullptr;) delete std::exchange(b, b->next);
      returned(c->addr, c->size, give_back);
      delete c;
    }
    chunks_.clear();
    chunks_changed();
  }

  /// Checks the heap's invariants (the class comment's, and that blocks tile their chunks in
  /// address order), calling fail(what) on the first broken one and on_block(b) for every
  /// block, in address order, so the pool can check what it knows of live and lane blocks.
  template <class Fail, class OnBlock>
  void check(Fail&& fail, OnBlock&& on_block) const {
    std::size_t reserved = 0;
    std::map<const stream_info*, std::size_t> free_per_stream;
    for (const auto& [addr, c] : chunks_) {
      if (addr != c->addr || c->first == nullptr || c->first->prev != nullptr) fail("chunk head");
      reserved += c->size;
      std::uintptr_t at = c->addr;
      const block* last = nullptr;
      for (const block* b = c->first; b != nullptr; b = b->next) {
        if (b->addr != at || b->size == 0 || b->size % quantum != 0 || b->owner != c) fail("blocks do not tile the chunk");
        if (b->prev != last) fail("list links");
        at += b->size;
        last = b;
        if (b->state == block_state::free) {
          ++free_per_stream[b->stream];
          if (!b->stream->index.contains(b)) fail("free block not indexed");
          if (b->next && b->next->state == block_state::free && b->next->stream == b->stream)
            fail("adjacent free blocks with one key not coalesced");
        }
        on_block(b);
      }
      if (last != c->last || at != c->addr + c->size) fail("chunk tail");
    }
    if (reserved != reserved_) fail("chunk sizes != reserved");
    if (contiguous_)
      for (auto it = chunks_.begin(); it != chunks_.end() && std::next(it) != chunks_.end(); ++it)
        if (it->second->addr + it->second->size == std::next(it)->first) fail("adjacent chunks not merged");
    if (top_ != (chunks_.empty() ? nullptr : chunks_.rbegin()->second)) fail("top chunk");
    for (const auto& [key, info] : streams_)
      if (info.index.size() != free_per_stream[&info]) fail("per-stream free counts");
  }

  /// True when addr starts a free or lane-owned block that is not live (a second free of a
  /// block); pre: addr is in no live map.
  [[nodiscard]] bool free_block_at(std::uintptr_t addr) const noexcept {
    auto it = chunks_.upper_bound(addr);
    if (it == chunks_.begin()) return false;
    const chunk* c = std::prev(it)->second;
    if (addr >= c->addr + c->size) return false;
    for (const block* b = c->first; b != nullptr && b->addr <= addr; b = b->next)
      if (b->addr == addr) return b->state != block_state::live;  // lane: not in a live map, so in a bin
    return false;
  }

 private:
  /// A node holding `init`: a recycled one when there is one. (Taking `init` rather than
  /// resetting the node and then setting fields lets the compiler write each field once,
  /// instead of a `rep stos` over the whole node followed by the stores.)
  block* new_block(const block& init = {}) {
    if (spare_ != nullptr) {
      block* b = std::exchange(spare_, spare_->next);
      *b = init;
      return b;
    }
    return new block(init);
  }
  void delete_block(block* b) noexcept {
    b->next = spare_;
    spare_ = b;
  }

  void index_insert(block* b) {
    b->state = block_state::free;
    b->stream->index.insert(b);
  }
  void index_erase(block* b) noexcept { b->stream->index.erase(b); }

  /// Best fit on `stream` for `need` bytes, or nullptr. With a contiguous upstream the free
  /// block at the top of the highest chunk (the "wilderness", which in-place growth extends)
  /// is taken only when no other block fits: carving small blocks out of it would pin the
  /// top and make the next large request grow instead of extending it.
  block* fit(const stream_info& stream, std::size_t need) {
    const auto& index = stream.index;
    block* b = index.best_fit(need);
    if (b != nullptr && is_wilderness(b))
      if (block* next = index.next(b)) return next;
    return b;
  }

  /// Call after chunks_ changed: keeps top_ (the highest chunk) current.
  void chunks_changed() noexcept { top_ = chunks_.empty() ? nullptr : chunks_.rbegin()->second; }

  /// Whether free neighbour n may join a free block keyed `stream`: the same key, or
  /// (`widen`) n is usable by every stream (key 0) and the block is a stream's. The union is
  /// keyed to that stream (usable by every stream is the weaker promise), so a block freed
  /// on a stream merges with the fresh or merged memory around it instead of leaving a seam
  /// at every key change. A key-0 block never absorbs a stream's block: fresh memory must
  /// stay usable by the stream that grew the pool.
  bool joins(const block* n, const stream_info* stream, bool widen) const noexcept {
    return n != nullptr && n->state == block_state::free &&
           (n->stream == stream || (widen && stream != info0_ && n->stream == info0_));
  }
  /// b (not indexed) absorbs its joinable free neighbours; returns the survivor. The union
  /// keeps b's key (a stream's block takes key-0 neighbours over; a key-0 block joins only
  /// key-0 ones), so absorbing on one side never makes the other side joinable: one walk to
  /// the left, then one to the right. A side may hold several joinable blocks in a row
  /// (0 | S | 0 | S runs form when key-0 blocks are freed beside a stream's).
  block* coalesce(block* b, bool widen = true) noexcept {
    const stream_info* key = b->stream;
    while (joins(b->prev, key, widen)) {
      block* p = b->prev;
      index_erase(p);
      absorb(p, b);
      b = p;
    }
    while (joins(b->next, key, widen)) {
      block* n = b->next;
      index_erase(n);
      absorb(b, n);
    }
    return b;
  }
  /// a (not indexed) takes over its successor n; the union keeps the stream key of either (0
  /// only if both are 0) and the epoch of the parts with that key.
  void absorb(block* a, block* n) noexcept {
    if (a->stream == n->stream) {
      a->epoch = std::max(a->epoch, n->epoch);
    } else if (a->stream == info0_) {
      a->stream = n->stream;
      a->epoch = n->epoch;
    }
    a->size += n->size;
    a->next = n->next;
    if (n->next) n->next->prev = a;
    if (n->owner->last == n) n->owner->last = a;
    delete_block(n);
  }

  /// Cuts b after `front` bytes; returns the new successor block (same key and epoch).
  block* split(block* b, std::size_t front) {
    block* n = new_block({.addr = b->addr + front,
                          .size = b->size - front,
                          .prev = b,
                          .next = b->next,
                          .owner = b->owner,
                          .stream = b->stream,
                          .epoch = b->epoch});
    if (b->next) b->next->prev = n;
    b->next = n;
    b->size = front;
    if (b->owner->last == b) b->owner->last = n;
    return n;
  }

  /// Contiguous upstream: returns [lo, hi) (granule-aligned, inside free block b) and splits
  /// b's chunk around the hole.
  template <class GiveBack>
  void cut(block* b, std::uintptr_t lo, std::uintptr_t hi, GiveBack& give_back) {
    chunk* c = b->owner;
    std::uintptr_t c_end = c->addr + c->size, b_end = b->addr + b->size;
    index_erase(b);
    block* before = b->prev;
    block* after = b->next;
    block* old_last = c->last;
    block* head = nullptr;
    block* tail = nullptr;
    if (hi < b_end) {
      tail = new_block();
      tail->addr = hi;
      tail->size = b_end - hi;
      tail->stream = b->stream;
      tail->epoch = b->epoch;
    }
    if (lo > b->addr) {
      head = b;
      head->size = lo - b->addr;
    } else {
      delete_block(b);
    }
    // The part below the hole stays in c.
    block* low_last = head ? head : before;
    if (low_last) {
      low_last->next = nullptr;
      c->last = low_last;
      c->size = lo - c->addr;
    } else {
      chunks_.erase(c->addr);
      delete c;
      c = nullptr;
    }
    // The part above the hole becomes a new chunk.
    block* high_first = tail ? tail : after;
    if (high_first) {
      chunk* h = new chunk{hi, c_end - hi, high_first, tail && !after ? tail : old_last};
      if (tail) {
        tail->next = after;
        if (after) after->prev = tail;
      }
      high_first->prev = nullptr;
      for (block* x = high_first; x != nullptr; x = x->next) x->owner = h;
      chunks_.emplace(hi, h);
    }
    chunks_changed();
    if (head) index_insert(head);
    if (tail) index_insert(tail);
    returned(lo, hi - lo, give_back);
  }

  template <class GiveBack>
  void returned(std::uintptr_t addr, std::size_t bytes, GiveBack& give_back) noexcept {
    give_back(addr, bytes);
    reserved_ -= bytes;
    ++upstream_deallocations_;
  }

  bool contiguous_;
  std::size_t granularity_;
  std::map<std::uintptr_t, chunk*> chunks_;  // by address; sum of sizes == reserved_
  chunk* top_ = nullptr;                     // the highest chunk (its last block: the wilderness)
  std::unordered_map<std::uintptr_t, stream_info> streams_;  // free blocks, indexed per stream key
  stream_info* info0_ = nullptr;      // &streams_[0] (nodes of an unordered_map are stable)
  stream_info* last_info_ = nullptr;  // info_of's memo: &streams_[last_info_key_], a stream's key
  std::uintptr_t last_info_key_ = 0;
  block* spare_ = nullptr;            // recycled block nodes
  std::size_t reserved_ = 0;
  std::size_t peak_reserved_ = 0;
  std::size_t upstream_allocations_ = 0;
  std::size_t upstream_deallocations_ = 0;
};

}  // namespace vram::detail::stream_pool
