// The tracker's PyTorch memory snapshot, checked against PyTorch's own format: the keys and
// value types torch.cuda.memory._snapshot() writes, the block states it knows, and the
// orders its viewer (MemoryViz.js: Active Memory Timeline, Allocator State History) and
// torch/cuda/_memory_viz.py assume. Snapshots come from tracker_adaptor over a stream_pool
// and from tracker_observer inside one, with several host streams, blocks reused while their
// free is pending, an OOM, a small event ring (events dropped) and frees pending at the dump.
//
// With VRAM_SNAPSHOT_DIR set, every snapshot is also written there, for the Python check
// (tests/adaptor/pytorch_snapshot_check.py, the CTest test adaptor.tracker_snapshot.python).
#include <catch2/catch.hpp>

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <vram/adaptor/tracker_adaptor.hpp>
#include <vram/adaptor/tracker_observer.hpp>
#include <vram/alloc/stream_pool.hpp>
#include <vram/core/event.hpp>
#include <vram/core/resource_ref.hpp>
#include <vram/trace/detail/pickle.hpp>
#include <vram/source/host_source.hpp>

#include "support/recording_resource.hpp"

namespace {

using vram::detail::trace::pickle_document;
using vram::detail::trace::pickle_node;
using kind = pickle_node::kind;

// ---- reading the snapshot as PyTorch's tools do ---------------------------------------------

struct reader {
  const pickle_document& doc;

  const pickle_node& at(std::uint32_t i) const { return doc.at(i); }
  /// The value of `key` in `dict`, which must be present with type `k`.
  const pickle_node& get(const pickle_node& dict, const char* key, kind k) const {
    INFO("key " << key);
    const pickle_node* v = doc.find(dict, key);
    REQUIRE(v != nullptr);
    REQUIRE(v->type == k);
    return *v;
  }
  std::int64_t integer(const pickle_node& dict, const char* key) const { return get(dict, key, kind::integer).integer; }
  const std::string& text(const pickle_node& dict, const char* key) const { return get(dict, key, kind::string).text; }
  bool has(const pickle_node& dict, const char* key) const { return doc.find(dict, key) != nullptr; }
};

/// Frames as PyTorch writes them: a list of {name, filename, line}.
void check_frames(const reader& r, const pickle_node& owner) {
  const auto& frames = r.get(owner, "frames", kind::list);
  for (auto f : frames.items) {
    const auto& frame = r.at(f);
    REQUIRE(frame.type == kind::dict);
    (void)r.text(frame, "name");
    (void)r.text(frame, "filename");
    (void)r.integer(frame, "line");
  }
}

struct block_state {
  std::int64_t addr, size;
  bool pending;
};
struct segment_state {
  std::int64_t addr, size;
};

/// What a snapshot held, for the scenario's own assertions.
struct summary {
  std::size_t segments = 0, allocated_blocks = 0, pending_blocks = 0;
  std::size_t ooms = 0, events = 0, reused_addresses = 0;  // allocs at a freed address
};

/// Checks everything PyTorch's readers rely on; returns what was seen.
summary check_pytorch_snapshot(const std::string& bytes, int device) {
  auto doc = vram::detail::trace::parse_pickle(bytes, "snapshot");
  reader r{doc};
  const auto& root = r.at(doc.root);
  REQUIRE(root.type == kind::dict);
  const auto& segments = r.get(root, "segments", kind::list);
  const auto& traces = r.get(root, "device_traces", kind::list);
  (void)r.get(root, "allocator_settings", kind::dict);
  summary out;

  // Final state. Segments in address order, disjoint; each one's blocks start at its
  // address and cover it exactly (the viewer computes a block's address as a running sum);
  // the sizes are PyTorch's: allocated = active_allocated blocks, active = allocated or
  // pending, requested = requested sizes of the active blocks.
  std::vector<segment_state> final_segments;
  std::map<std::int64_t, block_state> final_blocks;
  std::int64_t previous_end = 0;
  for (auto si : segments.items) {
    const auto& seg = r.at(si);
    REQUIRE(seg.type == kind::dict);
    CHECK(r.integer(seg, "device") == device);
    std::int64_t address = r.integer(seg, "address"), total = r.integer(seg, "total_size");
    CHECK(address >= previous_end);
    previous_end = address + total;
    (void)r.integer(seg, "stream");
    std::string type = r.text(seg, "segment_type");
    CHECK((type == "large" || type == "small"));
    const auto& pool_id = r.get(seg, "segment_pool_id", kind::tuple);
    REQUIRE(pool_id.items.size() == 2);
    for (auto x : pool_id.items) CHECK(r.at(x).type == kind::integer);
    (void)r.get(seg, "is_expandable", kind::boolean);
    check_frames(r, seg);
    std::int64_t at = address, allocated = 0, active = 0, requested = 0;
    for (auto bi : r.get(seg, "blocks", kind::list).items) {
      const auto& b = r.at(bi);
      REQUIRE(b.type == kind::dict);
      CHECK(r.integer(b, "address") == at);
      std::int64_t size = r.integer(b, "size"), req = r.integer(b, "requested_size");
      std::string state = r.text(b, "state");
      check_frames(r, b);
      INFO("block state " << state);
      REQUIRE((state == "active_allocated" || state == "active_pending_free" || state == "inactive"));
      CHECK(size > 0);
      if (state != "inactive") {
        active += size;
        requested += req;
        CHECK(req <= size);
        final_blocks[at] = block_state{at, size, state == "active_pending_free"};
        ++(state == "active_allocated" ? out.allocated_blocks : out.pending_blocks);
      }
      if (state == "active_allocated") allocated += size;
      at += size;
    }
    CHECK(at == address + total);
    CHECK(r.integer(seg, "allocated_size") == allocated);
    CHECK(r.integer(seg, "active_size") == active);
    CHECK(r.integer(seg, "requested_size") == requested);
    final_segments.push_back({address, total});
  }
  out.segments = final_segments.size();

  // The trace: one list per device up to ours; entries with PyTorch's keys (an oom carries
  // device_free instead of addr: _memory_viz.py trace reads it, the viewer prints it).
  REQUIRE(traces.items.size() == static_cast<std::size_t>(device) + 1);
  const auto& trace = r.at(traces.items[static_cast<std::size_t>(device)]);
  REQUIRE(trace.type == kind::list);
  struct entry {
    std::string action;
    std::int64_t addr, size;
  };
  std::vector<entry> events;
  static const std::set<std::string> actions = {"alloc",         "free_requested", "free_completed", "segment_alloc",
                                                "segment_free",  "segment_map",    "segment_unmap",  "oom",
                                                "snapshot"};
  for (auto ei : trace.items) {
    const auto& e = r.at(ei);
    REQUIRE(e.type == kind::dict);
    entry x{r.text(e, "action"), 0, r.integer(e, "size")};
    INFO("action " << x.action);
    CHECK(actions.contains(x.action));
    (void)r.integer(e, "stream");
    (void)r.integer(e, "time_us");
    check_frames(r, e);
    if (x.action == "oom") {
      CHECK(r.integer(e, "device_free") >= 0);
      CHECK(!r.has(e, "addr"));
      ++out.ooms;
    } else {
      x.addr = r.integer(e, "addr");
    }
    events.push_back(x);
  }
  out.events = events.size();

  // Forward, per block: alloc -> free_requested -> free_completed, and no alloc overlapping
  // a block that is allocated or whose free is pending (PyTorch never emits one). Blocks
  // whose alloc fell out of the ring first appear with their free.
  struct open_block {
    std::int64_t size;
    bool pending;
  };
  std::map<std::int64_t, open_block> open;
  std::set<std::int64_t> ever_pending;  // addresses with a free_requested seen so far
  auto overlapping = [&](std::int64_t a, std::int64_t n) {
    auto it = open.lower_bound(a + n);
    return it != open.begin() && std::prev(it)->first + std::prev(it)->second.size > a;
  };
  for (std::size_t i = 0; i < events.size(); ++i) {
    const auto& e = events[i];
    INFO("event " << i << ": " << e.action << " at " << e.addr);
    if (e.action == "alloc") {
      CHECK(!overlapping(e.addr, e.size));
      if (ever_pending.contains(e.addr)) ++out.reused_addresses;  // an address freed before
      open[e.addr] = open_block{e.size, false};
    } else if (e.action == "free_requested") {
      auto it = open.find(e.addr);
      if (it != open.end()) {
        CHECK(!it->second.pending);
        CHECK(it->second.size == e.size);
        it->second.pending = true;
      } else {
        CHECK(!overlapping(e.addr, e.size));  // allocated before the trace began
        open[e.addr] = open_block{e.size, true};
      }
      ever_pending.insert(e.addr);
    } else if (e.action == "free_completed") {
      auto it = open.find(e.addr);
      if (it != open.end()) {
        CHECK(it->second.pending);  // never completed before it was requested
        open.erase(it);
      }
    }
  }
  // What the trace leaves open is what the final segments hold, in the same state (the
  // timeline ends those allocations at the end; the state history starts from them).
  for (auto& [a, b] : open) {
    INFO("open at the end of the trace: " << a);
    auto it = final_blocks.find(a);
    REQUIRE(it != final_blocks.end());
    CHECK(it->second.size == b.size);
    CHECK(it->second.pending == b.pending);
  }

  // Backward, as the Allocator State History replays it from the final state: a
  // free_requested needs its block present, a segment_alloc its segment, and at every step
  // every block lies inside a segment.
  std::map<std::int64_t, block_state> blocks = final_blocks;
  std::map<std::int64_t, std::int64_t> segs;
  for (auto& s : final_segments) segs[s.addr] = s.size;
  auto inside_a_segment = [&](const block_state& b) {
    auto it = segs.upper_bound(b.addr);
    return it != segs.begin() && b.addr + b.size <= std::prev(it)->first + std::prev(it)->second;
  };
  for (std::size_t i = events.size(); i-- > 0;) {
    const auto& e = events[i];
    INFO("replaying event " << i << " backwards: " << e.action << " at " << e.addr);
    if (e.action == "free_completed") {
      blocks[e.addr] = block_state{e.addr, e.size, true};
    } else if (e.action == "free_requested") {
      auto it = blocks.find(e.addr);
      REQUIRE(it != blocks.end());
      it->second.pending = false;
    } else if (e.action == "alloc") {
      blocks.erase(e.addr);
    } else if (e.action == "segment_free") {
      segs[e.addr] = e.size;
    } else if (e.action == "segment_alloc") {
      auto it = segs.find(e.addr);
      REQUIRE(it != segs.end());
      CHECK(it->second == e.size);
      segs.erase(it);
    }
    for (auto& [a, b] : blocks) {
      INFO("block at " << a);
      CHECK(inside_a_segment(b));
    }
  }
  return out;
}

// ---- the workload ---------------------------------------------------------------------------

/// Holds a host stream's tasks back until opened, so frees on it stay pending.
struct gate {
  std::mutex m;
  std::condition_variable cv;
  bool open = false;
  void hold(vram::host_stream& s) {
    {
      std::lock_guard lock(m);
      open = false;
    }
    s.enqueue([this] {
      std::unique_lock lock(m);
      cv.wait(lock, [&] { return open; });
    });
  }
  void release() {
    {
      std::lock_guard lock(m);
      open = true;
    }
    cv.notify_all();
  }
};

struct live_block {
  void* p;
  std::size_t bytes;
  std::size_t stream;
};

/// Random allocations and frees on three host streams, two of them held back at times so
/// that frees stay pending while the pool hands their blocks out again on the same stream;
/// an allocation beyond the pool's maximum (OOM); the dump taken with frees still pending.
/// `alloc(s, n)` / `free(s, p, n)` go through the resource under test; `dump()` returns the
/// pickle. Returns the pickle; frees what is left afterwards.
template <class Alloc, class Free, class Dump>
std::string run_workload(Alloc alloc, Free free, Dump dump, std::size_t& reuses_while_held) {
  vram::host_stream streams[3];
  gate gates[2];
  std::mt19937 rng(42);
  std::vector<live_block> live;
  std::set<void*> freed_while_held[2];
  reuses_while_held = 0;
  gates[0].hold(streams[0]);
  gates[1].hold(streams[1]);
  auto on = [&](std::size_t i) { return vram::stream_ref(streams[i]); };
  for (int step = 0; step < 400; ++step) {
    if (step % 100 == 50) {  // let the held streams run, then hold them again
      // Both at once: a held stream may wait for the other (a block taken across streams).
      for (auto& g : gates) g.release();
      for (auto& s : streams) s.synchronize();
      for (std::size_t g = 0; g < 2; ++g) {
        freed_while_held[g].clear();
        gates[g].hold(streams[g]);
      }
    }
    bool allocate = live.size() < 8 || (live.size() < 40 && rng() % 2 == 0);
    if (allocate) {
      std::size_t s = rng() % 3;
      std::size_t bytes = (std::size_t{1} + rng() % 64) * 1024 + rng() % 256;
      void* p = alloc(on(s), bytes);
      REQUIRE(p != nullptr);
      if (s < 2 && freed_while_held[s].contains(p)) ++reuses_while_held;
      live.push_back({p, bytes, s});
    } else {
      std::size_t i = rng() % live.size();
      auto b = live[i];
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
      free(on(b.stream), b.p, b.bytes);
      if (b.stream < 2) freed_while_held[b.stream].insert(b.p);
    }
  }
  CHECK_THROWS_AS(alloc(on(2), std::size_t{64} << 20), vram::out_of_memory);
  // Frees pending at the dump: the first two streams are still held.
  std::size_t held_frees = 0;
  for (std::size_t i = live.size(); i-- > 0 && held_frees < 4;) {
    if (live[i].stream == 2) continue;
    free(on(live[i].stream), live[i].p, live[i].bytes);
    live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    ++held_frees;
  }
  REQUIRE(held_frees == 4);
  std::string pickle = dump();
  for (auto& g : gates) g.release();
  for (auto& s : streams) s.synchronize();
  for (auto& b : live) free(on(b.stream), b.p, b.bytes);
  for (auto& s : streams) s.synchronize();
  return pickle;
}

void save(const std::string& name, const std::string& bytes) {
  const char* dir = std::getenv("VRAM_SNAPSHOT_DIR");
  if (dir == nullptr || *dir == '\0') return;
  std::filesystem::create_directories(dir);
  std::ofstream out(std::filesystem::path(dir) / (name + ".pickle"), std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out);
}

using upstream_t = vram::test::recording_resource<vram::host_source>;
constexpr vram::stream_pool_options pool_options{.maximum_size = std::size_t{16} << 20,
                                                 .growth_step = std::size_t{2} << 20};

}  // namespace

TEST_CASE("tracker snapshot: tracker_adaptor over a stream_pool reads as PyTorch's", "[adaptor][tracker][snapshot]") {
  const std::size_t ring = GENERATE(std::size_t{1} << 16, std::size_t{96});
  INFO("event ring of " << ring);
  upstream_t up;
  std::string pickle;
  std::size_t reuses = 0, pending = 0, dropped = 0;
  {
    vram::stream_pool<upstream_t> pool(up, pool_options);
    vram::tracker_adaptor<vram::resource_ref<>> tracker(vram::resource_ref<>(pool),
                                                        {.event_capacity = ring, .device = 1});
    pickle = run_workload([&](vram::stream_ref s, std::size_t n) { return tracker.allocate(s, n); },
                          [&](vram::stream_ref s, void* p, std::size_t n) {
                            tracker.deallocate(s, p, n);
                            if (n % 7 == 0) tracker.check_invariants();
                          },
                          [&] {
                            pending = tracker.pending_frees();
                            dropped = tracker.dropped_events();
                            std::ostringstream out;
                            tracker.write_memory_snapshot(out);
                            return out.str();
                          },
                          reuses);
    CHECK(tracker.pending_frees() == 0);  // the streams ran: every free completed
    CHECK(tracker.stats().live_allocations == 0);
  }
  CHECK(reuses > 0);  // the pool handed out blocks whose free was still pending
  CHECK(pending >= 4);
  CHECK((dropped > 0) == (ring < 1000));
  save(ring < 1000 ? "adaptor_small_ring" : "adaptor", pickle);
  auto seen = check_pytorch_snapshot(pickle, 1);
  CHECK(seen.pending_blocks == pending);
  CHECK(seen.ooms == 1);
  if (ring > 1000) CHECK(seen.reused_addresses > 0);
  CHECK(up.counters().live_allocations() == 0);
}

TEST_CASE("tracker snapshot: tracker_observer inside a stream_pool reads as PyTorch's", "[adaptor][tracker][snapshot]") {
  const std::size_t ring = GENERATE(std::size_t{1} << 16, std::size_t{96});
  INFO("event ring of " << ring);
  upstream_t up;
  vram::tracker_observer tracker({.event_capacity = ring});
  std::string pickle;
  std::size_t reuses = 0, pending = 0;
  {
    vram::stream_pool<upstream_t, vram::tracker_observer> pool(up, pool_options, tracker);
    pickle = run_workload([&](vram::stream_ref s, std::size_t n) { return pool.allocate(s, n); },
                          [&](vram::stream_ref s, void* p, std::size_t n) { pool.deallocate(s, p, n); },
                          [&] {
                            pending = tracker.pending_frees();
                            std::ostringstream out;
                            tracker.write_memory_snapshot(out);
                            return out.str();
                          },
                          reuses);
    CHECK(tracker.pending_frees() == 0);
  }
  CHECK(reuses > 0);
  CHECK(pending >= 4);
  save(ring < 1000 ? "observer_small_ring" : "observer", pickle);
  auto seen = check_pytorch_snapshot(pickle, 0);
  CHECK(seen.pending_blocks == pending);
  CHECK(seen.ooms == 1);
  if (ring > 1000) CHECK(seen.reused_addresses > 0);
  // The pool gave everything back: each segment_alloc has its segment_free.
  std::size_t grows = 0, releases = 0;
  for (auto& e : tracker.events()) {
    grows += e.action == vram::tracker_action::segment_alloc;
    releases += e.action == vram::tracker_action::segment_free;
  }
  if (ring > 1000) CHECK(grows == releases);
  CHECK(up.counters().live_allocations() == 0);
}

TEST_CASE("tracker snapshot: a free pending on a stream shows as active_pending_free", "[adaptor][tracker][snapshot]") {
  upstream_t up;
  vram::tracker_adaptor<upstream_t> tracker(up);
  vram::host_stream stream;
  gate g;
  void* p = tracker.allocate(stream, 4096);
  g.hold(stream);
  tracker.deallocate(stream, p, 4096);
  CHECK(tracker.pending_frees() == 1);
  std::ostringstream out;
  tracker.write_memory_snapshot(out);
  auto seen = check_pytorch_snapshot(out.str(), 0);
  CHECK(seen.pending_blocks == 1);
  CHECK(seen.allocated_blocks == 0);
  g.release();
  stream.synchronize();
  CHECK(tracker.pending_frees() == 0);
  auto ev = tracker.events();
  REQUIRE(ev.size() == 5);
  CHECK(ev[3].action == vram::tracker_action::free_completed);
  CHECK(ev[4].action == vram::tracker_action::segment_free);
  std::ostringstream after;
  tracker.write_memory_snapshot(after);
  seen = check_pytorch_snapshot(after.str(), 0);
  CHECK(seen.segments == 0);
  CHECK(up.counters().live_allocations() == 0);
}

TEST_CASE("tracker snapshot: markers polled, never waited for, complete in stream order", "[adaptor][tracker]") {
  // The CUDA-stream path of the tracker (an event at the free, polled later), driven here
  // by host-stream events, which vram::event records and queries the same way.
  vram::detail::tracker::tracker_pending_markers markers;
  vram::host_stream a, b;
  gate ga;
  ga.hold(a);
  markers.add(a, 0x1000, 1);
  markers.add(b, 0x2000, 2);
  markers.add(a, 0x3000, 3);
  b.synchronize();
  std::vector<std::uint64_t> done;
  auto record = [&](std::uintptr_t, std::uint64_t id) { done.push_back(id); };
  markers.poll(record);
  CHECK(done == std::vector<std::uint64_t>{2});  // a is held: its frees stay pending
  CHECK(markers.size() == 2);
  ga.release();
  a.synchronize();
  markers.poll(record);
  CHECK(done == std::vector<std::uint64_t>{2, 1, 3});
  CHECK(markers.size() == 0);
  markers.add(b, 0x4000, 4);  // reuses a recycled event
  b.synchronize();
  markers.poll(record);
  CHECK(done.back() == 4);
}
