// What observability costs per operation, measured against the bare resource in one run.
//
// The upstream is deliberately trivial (a LIFO free list of fixed 256-byte slots, no locks),
// so the few nanoseconds an adaptor adds are visible instead of hidden in a real allocator's
// cost. Each iteration is one allocate + one deallocate (two operations).
//
//   bare                     the free list alone
//   observer/none            the free list calling a no_observer (must equal bare: zero cost)
//   observer/counting        the free list calling an observer with relaxed atomic counters
//   statistics_adaptor       counters in total and per tenant
//   quota_adaptor            hierarchical reservation + per-pointer record (sharded map)
//   quota_adaptor/ledger     the same adaptor charging a quota ledger in shared memory (two
//                            levels; the ledger's robust mutex and slot instead of atomics)
//   tracker_adaptor          per-pointer record with tenant/tag + event ring, one mutex
//
// And over the real allocator a user stacks them on: stream_pool<host_source>'s bin path (a
// 256-byte pair on the default stream), each adaptor over vram::ref(pool), and the three
// stacked. An adaptor's cost is its figure minus pool/bare from the same run.
//
//   pool/bare                       the pool alone
//   pool/statistics_adaptor         statistics_adaptor{vram::ref(pool)}
//   pool/statistics_adaptor/own_stream  the same, one pool and adaptor shared by 1 and 2 threads,
//                                   each on its own host stream (does the pair scale?)
//   pool/quota_adaptor              quota_adaptor over the pool, two levels
//   pool/tracker_adaptor            tracker_adaptor over the pool
//   pool/tracker_adaptor/tagged     the same inside a tag_scope (the tag recorded with each event)
//   pool/tracker_adaptor/event_log  the same, appending every event to its event log (a file in
//                                   the temp directory, removed as soon as it is open)
//   pool/statistics+quota+tracker   tracker{quota{statistics{ref(pool)}}}
//   pool/ledger_quota_adaptor       ledger_quota_adaptor over the pool (charging each request)
//   pool_over_ledger                the pool over ledger_quota_adaptor over its source, as the C
//                                   ABI stacks them (charging the pool's chunks, so a pair that
//                                   the pool serves from its cache never reaches the ledger)
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <vram/adaptor/ledger_quota_adaptor.hpp>
#include <vram/adaptor/quota_adaptor.hpp>
#include <vram/adaptor/statistics_adaptor.hpp>
#include <vram/adaptor/tracker_adaptor.hpp>
#include <vram/alloc/stream_pool.hpp>
#include <vram/core/host_stream.hpp>
#include <vram/core/observer.hpp>
#include <vram/core/ref.hpp>
#include <vram/core/tag_scope.hpp>
#include <vram/source/host_source.hpp>

namespace {

constexpr std::size_t slot_bytes = 256;
constexpr std::size_t slots = 4096;

// Slots live in a static arena; the free list is an index stack. The optional observer is
// called the way allocators call theirs; `hooks = false` is the same code with no calls at all.
template <bool hooks, class Observer = vram::no_observer>
class freelist_resource {
 public:
  struct state {
    alignas(256) std::array<std::byte, slots * slot_bytes> memory;
    std::array<std::uint32_t, slots> free;
    std::size_t top = slots;
    state() {
      for (std::size_t i = 0; i < slots; ++i) free[i] = static_cast<std::uint32_t>(slots - 1 - i);
    }
  };
  freelist_resource() : s_(std::make_shared<state>()) {}

  void* allocate(vram::stream_ref s, std::size_t bytes, std::size_t = vram::default_alignment) {
    if (bytes > slot_bytes || s_->top == 0) [[unlikely]]
      vram::detail::throw_out_of_memory("freelist", bytes, s);
    void* p = &s_->memory[s_->free[--s_->top] * slot_bytes];
    if constexpr (hooks) observer_.on_allocate(p, bytes, s);
    return p;
  }
  void deallocate(vram::stream_ref s, void* p, std::size_t bytes, std::size_t = vram::default_alignment) noexcept {
    if constexpr (hooks) observer_.on_deallocate(p, bytes, s);
    s_->free[s_->top++] = static_cast<std::uint32_t>((static_cast<std::byte*>(p) - s_->memory.data()) / slot_bytes);
  }
  void* allocate_sync(std::size_t bytes, std::size_t align = vram::default_alignment) {
    return allocate({}, bytes, align);
  }
  void deallocate_sync(void* p, std::size_t bytes, std::size_t align = vram::default_alignment) noexcept {
    deallocate({}, p, bytes, align);
  }
  friend bool operator==(const freelist_resource& a, const freelist_resource& b) noexcept { return a.s_ == b.s_; }
  Observer& observer() noexcept { return observer_; }

 private:
  std::shared_ptr<state> s_;
  [[no_unique_address]] Observer observer_;
};

struct counting_observer {
  std::shared_ptr<std::atomic<std::size_t>> live = std::make_shared<std::atomic<std::size_t>>(0);
  void on_allocate(const void*, std::size_t b, vram::stream_ref) noexcept { live->fetch_add(b, std::memory_order_relaxed); }
  void on_deallocate(const void*, std::size_t b, vram::stream_ref) noexcept { live->fetch_sub(b, std::memory_order_relaxed); }
  void on_grow(const void*, std::size_t) noexcept {}
  void on_release(const void*, std::size_t) noexcept {}
  void on_out_of_memory(std::size_t, vram::stream_ref, const vram::stats&) noexcept {}
};
static_assert(vram::observer<counting_observer>);

using bare_t = freelist_resource<false>;

template <class R>
void pair_loop(benchmark::State& state, R& r) {
  // Keep a few blocks live so the free list is not a single slot bouncing.
  std::vector<void*> held;
  for (int i = 0; i < 8; ++i) held.push_back(r.allocate_sync(slot_bytes));
  for (auto _ : state) {
    void* p = r.allocate_sync(slot_bytes);
    benchmark::DoNotOptimize(std::as_const(p));
    r.deallocate_sync(p, slot_bytes);
  }
  for (void* p : held) r.deallocate_sync(p, slot_bytes);
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()) * 2);  // operations
}

void bare(benchmark::State& state) {
  bare_t r;
  pair_loop(state, r);
}
void observer_none(benchmark::State& state) {
  freelist_resource<true, vram::no_observer> r;
  pair_loop(state, r);
}
void observer_counting(benchmark::State& state) {
  freelist_resource<true, counting_observer> r;
  pair_loop(state, r);
}
void statistics(benchmark::State& state) {
  vram::statistics_adaptor<bare_t> r;
  vram::tenant_scope scope(vram::tenant::none());
  pair_loop(state, r);
}
void quota(benchmark::State& state) {
  auto reg = std::make_shared<vram::tenant_registry>();
  auto job = reg->create("job");
  auto model = reg->create("model", job);
  vram::quota_adaptor<bare_t> r(bare_t{}, reg);
  r.set_hard_limit(job, std::size_t{1} << 30);
  r.set_hard_limit(model, std::size_t{1} << 30);
  vram::tenant_scope scope(model);  // two levels to reserve on
  pair_loop(state, r);
}
/// A ledger of this run's own with job -> model, limits far above the loop's needs; its files
/// are removed at once (the handles keep them mapped).
struct two_level_ledger {
  std::string name = "vram-bench-" + std::to_string(::getpid());
  std::shared_ptr<vram::quota_ledger> admin = vram::quota_ledger::create(name);
  vram::tenant model = admin->add_tenant("job/model");
  std::shared_ptr<vram::quota_ledger> process = vram::quota_ledger::attach(name);
  two_level_ledger() {
    admin->set_hard_limit(admin->at("job"), std::size_t{1} << 40);
    admin->set_hard_limit(model, std::size_t{1} << 40);
    vram::quota_ledger::remove(name);
  }
  [[nodiscard]] vram::ledger_tenant account() const { return {process, model}; }
};

void quota_ledger(benchmark::State& state) {
  two_level_ledger l;
  vram::ledger_quota_adaptor<bare_t> r(bare_t{}, l.account());
  pair_loop(state, r);
}
void tracker(benchmark::State& state) {
  vram::tracker_adaptor<bare_t> r;
  pair_loop(state, r);
}

// ---- over stream_pool -------------------------------------------------------------------

using pool_t = vram::stream_pool<vram::host_source>;

/// Two levels of tenants with limits far above the loop's needs, the inner one in scope.
struct two_level_quota {
  std::shared_ptr<vram::tenant_registry> reg = std::make_shared<vram::tenant_registry>();
  vram::tenant job = reg->create("job");
  vram::tenant model = reg->create("model", job);
  template <class Q>
  void limit(Q& q) const {
    q.set_hard_limit(job, std::size_t{1} << 30);
    q.set_hard_limit(model, std::size_t{1} << 30);
  }
};

void pool_bare(benchmark::State& state) {
  pool_t pool;
  pair_loop(state, pool);
}
void pool_statistics(benchmark::State& state) {
  pool_t pool;
  vram::statistics_adaptor r{vram::ref(pool)};
  vram::tenant_scope scope(vram::tenant::none());
  pair_loop(state, r);
}
void pool_statistics_own_stream(benchmark::State& state) {
  static pool_t pool;
  static vram::statistics_adaptor r{vram::ref(pool)};
  vram::host_stream s;
  vram::tenant_scope scope(vram::tenant::none());
  for (auto _ : state) {
    void* p = r.allocate(s, slot_bytes);
    benchmark::DoNotOptimize(std::as_const(p));
    r.deallocate(s, p, slot_bytes);
  }
  s.synchronize();
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()) * 2);
}
void pool_quota(benchmark::State& state) {
  pool_t pool;
  two_level_quota t;
  vram::quota_adaptor r{vram::ref(pool), t.reg};
  t.limit(r);
  vram::tenant_scope scope(t.model);
  pair_loop(state, r);
}
void pool_tracker(benchmark::State& state) {
  pool_t pool;
  vram::tracker_adaptor r{vram::ref(pool)};
  pair_loop(state, r);
}
void pool_tracker_tagged(benchmark::State& state) {
  pool_t pool;
  vram::tracker_adaptor r{vram::ref(pool)};
  vram::tag_scope tag("decoder.layer12.self_attn.q_proj");  // a module path, as frameworks name them
  pair_loop(state, r);
}
void pool_tracker_event_log(benchmark::State& state) {
  pool_t pool;
  std::string path = "/tmp/vram-bench-event-log-" + std::to_string(::getpid()) + ".csv";
  vram::tracker_adaptor r{vram::ref(pool), vram::tracker_options{.event_log = path}};
  ::unlink(path.c_str());  // the open log still writes; the disk space goes with it
  pair_loop(state, r);
}
void pool_stack(benchmark::State& state) {
  pool_t pool;
  two_level_quota t;
  vram::tracker_adaptor r{vram::quota_adaptor{vram::statistics_adaptor{vram::ref(pool)}, t.reg},
                          vram::tracker_options{.registry = t.reg}};
  t.limit(r.upstream());
  vram::tenant_scope scope(t.model);
  pair_loop(state, r);
}

void pool_ledger(benchmark::State& state) {
  pool_t pool;
  two_level_ledger l;
  vram::ledger_quota_adaptor r(vram::ref(pool), l.account());
  pair_loop(state, r);
}
void pool_over_ledger(benchmark::State& state) {
  two_level_ledger l;
  vram::stream_pool pool(vram::ledger_quota_adaptor<vram::host_source>(vram::host_source{}, l.account()));
  pair_loop(state, pool);
}

}  // namespace

BENCHMARK(bare);
BENCHMARK(observer_none)->Name("observer/none");
BENCHMARK(observer_counting)->Name("observer/counting");
BENCHMARK(statistics)->Name("statistics_adaptor");
BENCHMARK(quota)->Name("quota_adaptor");
BENCHMARK(quota_ledger)->Name("quota_adaptor/ledger");
BENCHMARK(tracker)->Name("tracker_adaptor");
BENCHMARK(pool_bare)->Name("pool/bare");
BENCHMARK(pool_statistics)->Name("pool/statistics_adaptor");
BENCHMARK(pool_statistics_own_stream)->Name("pool/statistics_adaptor/own_stream")->Threads(1)->Threads(2)->UseRealTime();
BENCHMARK(pool_quota)->Name("pool/quota_adaptor");
BENCHMARK(pool_tracker)->Name("pool/tracker_adaptor");
BENCHMARK(pool_tracker_tagged)->Name("pool/tracker_adaptor/tagged");
BENCHMARK(pool_tracker_event_log)->Name("pool/tracker_adaptor/event_log");
BENCHMARK(pool_stack)->Name("pool/statistics+quota+tracker");
BENCHMARK(pool_ledger)->Name("pool/ledger_quota_adaptor");
BENCHMARK(pool_over_ledger)->Name("pool_over_ledger");

BENCHMARK_MAIN();
