// The bounded soak test: several threads x several host streams x every allocator, random
// sizes from the shared traces' size distribution, block contents verified with per-block
// patterns by host-stream tasks (a block handed to a stream before the previous owner's work
// ran shows up as a pattern mismatch).
//
// Bounded by count AND time: VRAM_STRESS_SECONDS (default 2; total over all allocators),
// and a per-thread operation cap. Under sanitizers (VRAM_SANITIZED=1) the default is 1 s and
// the caps are smaller. Run longer locally: VRAM_STRESS_SECONDS=60 test.reliability.stress
//
// Sizes: sampled from the PyTorch snapshot memory.pickle of the shared traces (allocations of
// at most 4 MiB) when VRAM_SHARED_TRACES holds it and the run is not sanitized; otherwise the
// embedded table below, which is that same distribution's 16-quantiles.
//
// No Catch assertion runs inside a worker thread or a stream task (Catch is not thread-safe):
// workers count problems in atomics, and the main thread checks them.

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include <vram/adaptor/quota_adaptor.hpp>
#include <vram/adaptor/statistics_adaptor.hpp>
#include <vram/adaptor/tracker_adaptor.hpp>
#include <vram/alloc/activation_arena.hpp>
#include <vram/alloc/budget_slab.hpp>
#include <vram/alloc/stream_pool.hpp>
#include <vram/core/event.hpp>
#include <vram/core/host_stream.hpp>
#include <vram/adaptor/fault_injection_adaptor.hpp>
#include <vram/source/host_source.hpp>
#include <vram/trace/read_trace.hpp>

#include "support/misuse_capture.hpp"
#include "support/recording_resource.hpp"

namespace {

using clock_type = std::chrono::steady_clock;
using recorded_host = vram::test::recording_resource<vram::host_source>;

bool sanitized() {
  const char* v = std::getenv("VRAM_SANITIZED");
  return v != nullptr && *v != '\0' && *v != '0';
}

double stress_seconds() {
  if (const char* v = std::getenv("VRAM_STRESS_SECONDS"))
    if (double s = std::atof(v); s > 0) return s;
  return sanitized() ? 1.0 : 2.0;
}

constexpr int allocator_runs = 7;  // the TEST_CASEs below share the time budget
constexpr std::size_t threads = 3;
constexpr std::size_t streams = 4;

std::size_t max_ops_per_thread() { return sanitized() ? 2000 : 50000; }

const std::vector<std::size_t>& trace_sizes();

/// The end of one allocator's share of the time budget (the sizes are read first: reading
/// the trace must not eat the budget).
clock_type::time_point deadline() {
  (void)trace_sizes();
  return clock_type::now() + std::chrono::duration_cast<clock_type::duration>(
                                 std::chrono::duration<double>(stress_seconds() / allocator_runs));
}

/// 16-quantiles of the allocation sizes (<= 4 MiB) in the shared traces' memory.pickle
/// (7234 allocations of its busiest device).
constexpr std::size_t embedded_sizes[] = {1,    4,     4,      992,    3072,   3072,    3072,    3072,
                                          3072, 3072,  12288,  614400, 761856, 2359296, 2359296, 2359296};

const std::vector<std::size_t>& trace_sizes() {
  static const std::vector<std::size_t> sizes = [] {
    std::vector<std::size_t> out;
#ifdef VRAM_SHARED_TRACES
    std::string path = std::string(VRAM_SHARED_TRACES) + "/memory.pickle";
    if (!sanitized() && std::filesystem::exists(path)) {
      try {
        auto t = vram::trace::read_trace(path);
        for (const auto& e : t.events)
          if (e.kind == vram::trace::event::op::alloc && e.bytes != 0 && e.bytes <= (std::size_t{4} << 20))
            out.push_back(e.bytes);
      } catch (const std::exception&) {
        out.clear();
      }
    }
#endif
    if (out.empty()) out.assign(std::begin(embedded_sizes), std::end(embedded_sizes));
    return out;
  }();
  return sizes;
}

/// What the workers found; checked by the main thread.
struct findings {
  std::atomic<std::size_t> corrupt{0};     // a block's pattern changed under it
  std::atomic<std::size_t> ooms{0};        // out_of_memory (tolerated: counted)
  std::atomic<std::size_t> unexpected{0};  // any other exception
  std::atomic<std::size_t> ops{0};
};

struct held {
  unsigned char* p;
  std::size_t bytes;
  std::size_t stream;
  unsigned char pattern;
};

// A block's pattern covers its first 64 KiB and its last 4 KiB: a block handed out too early
// is overwritten by its new owner from its start, so that catches it, and it keeps the cost of
// multi-MiB blocks (and of sanitizers' checks on every byte) bounded.
constexpr std::size_t head_bytes = 64 << 10, tail_bytes = 4 << 10;

void fill_task(unsigned char* p, std::size_t bytes, unsigned char v) {
  std::memset(p, v, std::min(bytes, head_bytes));
  if (bytes > head_bytes) std::memset(p + bytes - std::min(bytes - head_bytes, tail_bytes), v,
                                      std::min(bytes - head_bytes, tail_bytes));
}

bool intact(const unsigned char* p, std::size_t bytes, unsigned char v) {
  auto same = [v](unsigned char c) { return c == v; };
  std::size_t tail = bytes > head_bytes ? std::min(bytes - head_bytes, tail_bytes) : 0;
  return std::all_of(p, p + std::min(bytes, head_bytes), same) && std::all_of(p + bytes - tail, p + bytes, same);
}

/// One worker: allocate on a random stream (a task fills the block), free at random (a task
/// on the block's stream verifies it first; sometimes the free goes to another stream, which
/// first waits on an event of the block's stream: the documented cross-stream protocol).
template <class A>
void worker(A& a, std::vector<std::unique_ptr<vram::host_stream>>& ss, std::uint64_t seed, clock_type::time_point end,
            findings& f, bool cross_stream) {
  std::mt19937_64 rng(seed);
  const auto& sizes = trace_sizes();
  std::vector<held> live;
  auto release_one = [&](std::size_t i) {
    held b = live[i];
    live[i] = live.back();
    live.pop_back();
    ss[b.stream]->enqueue([b, &f] {
      if (!intact(b.p, b.bytes, b.pattern)) f.corrupt.fetch_add(1);
    });
    std::size_t on = b.stream;
    if (cross_stream && rng() % 4 == 0) {
      on = rng() % ss.size();
      vram::event e;
      e.record(*ss[b.stream]);
      e.make_wait(*ss[on]);
    }
    a.deallocate(*ss[on], b.p, b.bytes);
  };
  try {
    for (std::size_t n = 0; n < max_ops_per_thread() && clock_type::now() < end; ++n) {
      f.ops.fetch_add(1, std::memory_order_relaxed);
      if (n % 64 == 63) {  // keep the streams' queues short: the workers must not outrun them
        vram::event e;
        e.record(*ss[n / 64 % ss.size()]);
        e.synchronize();
      }
      if (live.empty() || (live.size() < 24 && rng() % 2 == 0)) {
        std::size_t bytes = sizes[rng() % sizes.size()];
        std::size_t si = rng() % ss.size();
        unsigned char* p;
        try {
          p = static_cast<unsigned char*>(a.allocate(*ss[si], bytes));
        } catch (const vram::out_of_memory&) {
          f.ooms.fetch_add(1);
          if (!live.empty()) release_one(rng() % live.size());
          continue;
        }
        auto v = static_cast<unsigned char>(1 + rng() % 255);
        ss[si]->enqueue([p, bytes, v] { fill_task(p, bytes, v); });
        live.push_back({p, bytes, si, v});
      } else {
        release_one(rng() % live.size());
      }
    }
    while (!live.empty()) release_one(live.size() - 1);
  } catch (...) {
    f.unexpected.fetch_add(1);
  }
}

std::vector<std::unique_ptr<vram::host_stream>> make_streams() {
  std::vector<std::unique_ptr<vram::host_stream>> ss;
  for (std::size_t i = 0; i < streams; ++i) ss.push_back(std::make_unique<vram::host_stream>());
  return ss;
}

template <class A>
void soak(A& a, std::vector<std::unique_ptr<vram::host_stream>>& ss, bool cross_stream = true) {
  findings f;
  auto end = deadline();
  std::vector<std::thread> ts;
  for (std::size_t t = 0; t < threads; ++t)
    ts.emplace_back([&, t] { worker(a, ss, 0x5eed + t, end, f, cross_stream); });
  for (auto& t : ts) t.join();
  for (auto& s : ss) s->synchronize();
  INFO("ops " << f.ops.load() << ", out of memory " << f.ooms.load());
  CHECK(f.corrupt.load() == 0);
  CHECK(f.unexpected.load() == 0);
  CHECK(f.ops.load() >= threads);
  if constexpr (vram::has_check_invariants<A>) a.check_invariants();
  if constexpr (vram::has_stats<A>) CHECK(a.stats().live_bytes == 0);
}

}  // namespace

TEST_CASE("stress: stream_pool, threads x host streams", "[reliability][stress]") {
  vram::test::misuse_capture misuse;
  recorded_host upstream;
  {
    auto ss = make_streams();
    vram::stream_pool<recorded_host> pool(upstream, {.growth_step = std::size_t{8} << 20});
    soak(pool, ss);
    CHECK(pool.release() > 0);
  }
  CHECK(misuse.count() == 0);
  CHECK(upstream.counters().live_allocations() == 0);
}

TEST_CASE("stress: stream_pool with a capped size and random upstream faults", "[reliability][stress]") {
  vram::test::misuse_capture misuse;
  recorded_host upstream;
  using faulty = vram::fault_injection_adaptor<recorded_host>;
  {
    auto ss = make_streams();
    faulty source(upstream, {.probability = 0.05, .seed = 42});
    vram::stream_pool<faulty> pool(source, {.maximum_size = std::size_t{48} << 20, .growth_step = std::size_t{4} << 20});
    soak(pool, ss);
  }
  CHECK(misuse.count() == 0);
  CHECK(upstream.counters().live_allocations() == 0);
}

TEST_CASE("stress: budget_slab with spill", "[reliability][stress]") {
  vram::test::misuse_capture misuse;
  recorded_host upstream;
  {
    auto ss = make_streams();
    vram::budget_slab<recorded_host, recorded_host> slab(upstream, upstream, {.device_budget = std::size_t{8} << 20});
    soak(slab, ss);
  }
  CHECK(misuse.count() == 0);
  CHECK(upstream.counters().live_allocations() == 0);
}

TEST_CASE("stress: quota_adaptor near its limit", "[reliability][stress]") {
  vram::test::misuse_capture misuse;
  recorded_host upstream;
  {
    auto ss = make_streams();
    vram::quota_adaptor<recorded_host> quota(upstream, std::make_shared<vram::tenant_registry>());
    quota.set_hard_limit(vram::tenant::none(), std::size_t{24} << 20);  // refusals are part of the test
    soak(quota, ss);
    CHECK(quota.usage(vram::tenant::none()) == 0);
    CHECK(quota.peak_usage(vram::tenant::none()) <= std::size_t{24} << 20);
  }
  CHECK(misuse.count() == 0);
  CHECK(upstream.counters().live_allocations() == 0);
}

TEST_CASE("stress: statistics_adaptor", "[reliability][stress]") {
  vram::test::misuse_capture misuse;
  recorded_host upstream;
  {
    auto ss = make_streams();
    vram::statistics_adaptor<recorded_host> stats(upstream);
    soak(stats, ss);
    CHECK(stats.stats().total_allocations == stats.stats().total_deallocations);
  }
  CHECK(misuse.count() == 0);
  CHECK(upstream.counters().live_allocations() == 0);
}

TEST_CASE("stress: tracker_adaptor", "[reliability][stress]") {
  vram::test::misuse_capture misuse;
  recorded_host upstream;
  {
    auto ss = make_streams();
    vram::tracker_adaptor<recorded_host> tracker(upstream, {.event_capacity = 4096});
    soak(tracker, ss);
    CHECK(tracker.live_allocations().empty());
  }
  CHECK(misuse.count() == 0);
  CHECK(upstream.counters().live_allocations() == 0);
}

TEST_CASE("stress: activation_arena, one arena per thread on its own stream, steps with reset",
          "[reliability][stress]") {
  // An arena is single-threaded and stream-bound: each thread runs training steps (forward:
  // allocate and fill; backward: verify and free in reverse, sometimes out of order; reset).
  vram::test::misuse_capture misuse;
  recorded_host upstream;
  findings f;
  {
    auto end = deadline();
    std::vector<std::thread> ts;
    for (std::size_t t = 0; t < threads; ++t)
      ts.emplace_back([&, t] {
        try {
          vram::host_stream s;
          vram::activation_arena<recorded_host> arena(upstream, s, {.chunk_bytes = std::size_t{4} << 20});
          std::mt19937_64 rng(0xa7e4 + t);
          const auto& sizes = trace_sizes();
          for (std::size_t step = 0; step < max_ops_per_thread() / 32 && clock_type::now() < end; ++step) {
            std::vector<held> acts;
            for (std::size_t layer = 0; layer < 24; ++layer) {
              std::size_t bytes = sizes[rng() % sizes.size()];
              auto* p = static_cast<unsigned char*>(arena.allocate(s, bytes));
              auto v = static_cast<unsigned char>(1 + rng() % 255);
              s.enqueue([p, bytes, v] { fill_task(p, bytes, v); });
              acts.push_back({p, bytes, 0, v});
              f.ops.fetch_add(1, std::memory_order_relaxed);
            }
            if (rng() % 3 == 0) std::swap(acts[acts.size() - 2], acts[acts.size() - 5]);  // out of order
            std::size_t keep = rng() % 4;  // a few survive to the reset
            while (acts.size() > keep) {
              held b = acts.back();
              acts.pop_back();
              s.enqueue([b, &f] {
                if (!intact(b.p, b.bytes, b.pattern)) f.corrupt.fetch_add(1);
              });
              arena.deallocate(s, b.p, b.bytes);
            }
            for (const held& b : acts)
              s.enqueue([b, &f] {
                if (!intact(b.p, b.bytes, b.pattern)) f.corrupt.fetch_add(1);
              });
            arena.reset();
            arena.check_invariants();
            if (step % 4 == 3) s.synchronize();  // the thread must not outrun its stream
          }
          s.synchronize();
          if (arena.stats().live_bytes != 0) f.unexpected.fetch_add(1);
        } catch (...) {
          f.unexpected.fetch_add(1);
        }
      });
    for (auto& t : ts) t.join();
  }
  INFO("ops " << f.ops.load());
  CHECK(f.corrupt.load() == 0);
  CHECK(f.unexpected.load() == 0);
  CHECK(f.ops.load() >= threads);
  CHECK(misuse.count() == 0);
  CHECK(upstream.counters().live_allocations() == 0);
}
