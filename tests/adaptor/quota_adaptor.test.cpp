#include <catch2/catch.hpp>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <vram/adaptor/quota_adaptor.hpp>
#include <vram/source/host_source.hpp>

#include "support/misuse_capture.hpp"
#include "support/recording_resource.hpp"

using upstream_t = vram::test::recording_resource<vram::host_source>;

namespace {

// A fresh registry per test: job -> {model_a, model_b}, model_a -> layer.
struct tree {
  std::shared_ptr<vram::tenant_registry> reg = std::make_shared<vram::tenant_registry>();
  vram::tenant job = reg->create("job");
  vram::tenant model_a = reg->create("model_a", job);
  vram::tenant model_b = reg->create("model_b", job);
  vram::tenant layer = reg->create("layer", model_a);
};

// An upstream that checks, at the moment the adaptor calls it, that no tenant is above its
// hard limit (the request is already reserved then: the strongest point to check).
struct limit_checker {
  std::atomic<const void*> quota{nullptr};
  std::atomic<std::size_t> violations{0};
  std::atomic<std::size_t> checks{0};
};

}  // namespace

TEST_CASE("quota_adaptor: hard limits are hierarchical and refuse before the upstream", "[adaptor][quota]") {
  tree t;
  upstream_t up;
  {
    vram::quota_adaptor<upstream_t> q(up, t.reg);
    q.set_hard_limit(t.job, 10000);
    q.set_hard_limit(t.model_a, 6000);

    void* a = q.allocate(vram::stream_ref{}, 4000, 256, t.layer);
    CHECK(q.usage(t.layer) == 4000);
    CHECK(q.usage(t.model_a) == 4000);
    CHECK(q.usage(t.job) == 4000);
    CHECK(q.usage(t.model_b) == 0);

    auto calls = up.counters().allocations.load();
    auto before = q.stats();
    try {
      (void)q.allocate(vram::stream_ref{}, 3000, 256, t.layer);  // model_a: 4000 + 3000 > 6000
      FAIL("expected quota_exceeded");
    } catch (const vram::quota_exceeded& e) {
      CHECK(e.limited_tenant() == t.model_a);
      CHECK(e.requester() == t.layer);
      CHECK(e.limit() == 6000);
      CHECK(e.usage() == 4000);
      CHECK(e.bytes() == 3000);
      CHECK(std::string(e.tenant_name()) == "model_a");
      CHECK(std::string(e.what()).find("model_a") != std::string::npos);
    }
    CHECK(up.counters().allocations.load() == calls);  // the upstream was not touched
    CHECK(q.usage(t.layer) == 4000);
    CHECK(q.usage(t.job) == 4000);
    CHECK(q.stats().live_bytes == before.live_bytes);
    CHECK(q.refusals(t.model_a) == 1);

    // The job limit binds a sibling: 4000 + 7000 > 10000.
    CHECK_THROWS_AS(q.allocate(vram::stream_ref{}, 7000, 256, t.model_b), vram::quota_exceeded);
    CHECK(q.usage(t.model_b) == 0);
    void* b = nullptr;
    {
      vram::tenant_scope scope(t.model_b);  // the current tenant is used without an argument
      b = q.allocate_sync(6000);
    }
    CHECK(q.usage(t.model_b) == 6000);
    CHECK(q.usage(t.job) == 10000);
    q.check_invariants();

    // Deallocation needs no tenant scope: the tenant was recorded per pointer.
    q.deallocate_sync(a, 4000);
    CHECK(q.usage(t.job) == 6000);
    CHECK(q.usage(t.model_a) == 0);
    q.deallocate_sync(b, 6000);
    CHECK(q.usage(t.job) == 0);
    CHECK(q.peak_usage(t.job) == 10000);
    q.check_invariants();
  }
  CHECK(up.counters().live_allocations() == 0);
}

TEST_CASE("quota_adaptor: lowering a limit below usage blocks new requests, frees still succeed", "[adaptor][quota]") {
  tree t;
  upstream_t up;
  vram::quota_adaptor<upstream_t> q(up, t.reg);
  void* a = q.allocate(vram::stream_ref{}, 5000, 256, t.model_a);
  void* b = q.allocate(vram::stream_ref{}, 5000, 256, t.model_a);
  q.set_hard_limit(t.model_a, 6000);
  CHECK(q.hard_limit(t.model_a) == 6000);
  CHECK_THROWS_AS(q.allocate(vram::stream_ref{}, 1, 256, t.model_a), vram::quota_exceeded);
  q.deallocate_sync(a, 5000);
  CHECK(q.usage(t.model_a) == 5000);
  void* c = q.allocate(vram::stream_ref{}, 1000, 256, t.model_a);  // 6000: exactly at the limit
  CHECK_THROWS_AS(q.allocate(vram::stream_ref{}, 1, 256, t.model_a), vram::quota_exceeded);
  q.set_hard_limit(t.model_a, decltype(q)::unlimited);
  void* d = q.allocate(vram::stream_ref{}, 1 << 20, 256, t.model_a);
  q.deallocate_sync(b, 5000);
  q.deallocate_sync(c, 1000);
  q.deallocate_sync(d, 1 << 20);
  CHECK(q.usage(t.model_a) == 0);
  CHECK(up.counters().live_allocations() == 0);
}

TEST_CASE("quota_adaptor: soft limits call back once per upward crossing", "[adaptor][quota]") {
  tree t;
  upstream_t up;
  vram::quota_adaptor<upstream_t> q(up, t.reg);
  std::vector<std::pair<std::uint32_t, std::size_t>> calls;
  q.set_soft_limit(t.job, 3000);
  q.set_soft_limit(t.layer, 1000);
  q.set_soft_limit_callback([&](vram::tenant who, std::size_t soft, std::size_t usage) {
    CHECK(usage > soft);
    calls.emplace_back(who.id, usage);
  });
  void* a = q.allocate(vram::stream_ref{}, 800, 256, t.layer);  // below both
  CHECK(calls.empty());
  void* b = q.allocate(vram::stream_ref{}, 800, 256, t.layer);  // layer crosses 1000
  REQUIRE(calls.size() == 1);
  CHECK(calls[0] == std::make_pair(t.layer.id, std::size_t{1600}));
  void* c = q.allocate(vram::stream_ref{}, 800, 256, t.layer);  // layer stays above: no call
  CHECK(calls.size() == 1);
  void* d = q.allocate(vram::stream_ref{}, 800, 256, t.model_b);  // job crosses 3000
  REQUIRE(calls.size() == 2);
  CHECK(calls[1].first == t.job.id);
  q.deallocate_sync(b, 800);
  q.deallocate_sync(c, 800);  // layer back to 800 <= 1000: re-armed
  void* e = q.allocate(vram::stream_ref{}, 800, 256, t.layer);  // layer crosses again (job 2400: not)
  REQUIRE(calls.size() == 3);
  CHECK(calls[2] == std::make_pair(t.layer.id, std::size_t{1600}));
  for (void* p : {a, d, e}) q.deallocate_sync(p, 800);
  CHECK(up.counters().live_allocations() == 0);
}

TEST_CASE("quota_adaptor: misuse is reported and changes nothing", "[adaptor][quota]") {
  vram::test::misuse_capture capture;
  tree t;
  upstream_t up;
  vram::quota_adaptor<upstream_t> q(up, t.reg);
  void* a = q.allocate(vram::stream_ref{}, 1000, 256, t.layer);
  q.deallocate_sync(a, 999);
  CHECK(capture.count(vram::misuse::wrong_size) == 1);
  CHECK(q.usage(t.job) == 1000);
  alignas(256) static char foreign[256];
  q.deallocate_sync(foreign, 256);
  CHECK(capture.count(vram::misuse::foreign_pointer) == 1);
  CHECK(up.counters().deallocations == 0);
  CHECK_THROWS_AS(q.allocate(vram::stream_ref{}, 1, 256, vram::tenant{200}), vram::invalid_argument);
  q.deallocate_sync(a, 1000);
  q.deallocate_sync(a, 1000);  // double free: unknown pointer now
  CHECK(capture.count(vram::misuse::foreign_pointer) == 2);
  CHECK(q.usage(t.job) == 0);
  CHECK(up.counters().live_allocations() == 0);
  q.check_invariants();
}

namespace {
/// The test's own record of the quota race, independent of the adaptor's counters. Per tenant:
///   held(t):   bytes the threads hold under t (added after allocate returned, taken off
///              before deallocate): never above what the adaptor has charged, so
///              held(t) > hard(t) at any instant proves the limit was passed;
///   intents(t): bytes of calls in flight or held under t (added before allocate, taken off
///              after the refusal or the free returned): never below what the adaptor has
///              charged, so a refusal naming t while intents(t) <= hard(t) refused a request
///              that fitted.
/// `changes` counts every change of intents and `busy` the changes under way (taken before the
/// first write, given back after `changes` moved), so a refusal whose call saw `changes` still
/// and nobody busy can be checked against intents exactly as they were when it was refused.
struct race_ledger {
  explicit race_ledger(const vram::tenant_registry& r) : reg(r), held(r.size()), intents(r.size()) {}
  const vram::tenant_registry& reg;
  std::vector<std::atomic<std::size_t>> held, intents;
  std::atomic<std::uint64_t> changes{0}, busy{0};
  std::atomic<std::size_t> over_limit{0}, verified_refusals{0}, unjustified_refusals{0}, foreign_refusals{0};

  template <class F>
  void for_chain(vram::tenant leaf, F&& f) const {
    for (vram::tenant t = leaf;;) {
      f(t);
      vram::tenant up;
      if (!reg.parent(t, up)) return;
      t = up;
    }
  }
  void intend(vram::tenant leaf, std::size_t bytes, bool add) {
    busy.fetch_add(1);
    for_chain(leaf, [&](vram::tenant t) {
      if (add) intents[t.id].fetch_add(bytes);
      else intents[t.id].fetch_sub(bytes);
    });
    changes.fetch_add(1);
    busy.fetch_sub(1);
  }
  /// Nothing changed intents since `seen` was read, and nothing is changing them: read after
  /// the intents it vouches for (busy first: a change ends by moving `changes`, then `busy`).
  [[nodiscard]] bool still(std::uint64_t seen) const { return busy.load() == 0 && changes.load() == seen; }
};
}  // namespace

namespace {
/// Six threads allocate and free at random for three leaves of `tree` whose limits are a few
/// requests deep; every request and limit is `scale` times those of the smallest run, so a
/// large scale leaves room for the threads' credit and a small one none.
void race_at_the_limit(std::size_t scale) {
  tree t;
  upstream_t up;
  race_ledger ledger(*t.reg);
  std::vector<std::size_t> hard(t.reg->size(), vram::quota_adaptor<upstream_t>::unlimited);
  hard[t.job.id] = 16 * 1024 * scale;
  hard[t.model_a.id] = 10 * 1024 * scale;
  hard[t.layer.id] = 6 * 1024 * scale;
  hard[t.model_b.id] = 10 * 1024 * scale;
  {
    vram::quota_adaptor<upstream_t> q(up, t.reg);
    for (std::uint32_t i = 0; i < t.reg->size(); ++i) q.set_hard_limit(vram::tenant{i}, hard[i]);
    const vram::tenant leaves[] = {t.layer, t.model_a, t.model_b};
    std::atomic<std::size_t> refused{0}, granted{0};
    std::vector<std::thread> threads;
    for (int th = 0; th < 6; ++th)
      threads.emplace_back([&, th] {
        std::mt19937 rng(static_cast<unsigned>(th));
        struct held {
          void* p;
          std::size_t bytes;
          vram::tenant leaf;
        };
        std::vector<held> mine;
        auto release = [&](const held& h) {
          ledger.for_chain(h.leaf, [&](vram::tenant x) { ledger.held[x.id].fetch_sub(h.bytes); });
          q.deallocate_sync(h.p, h.bytes);
          ledger.intend(h.leaf, h.bytes, false);
        };
        for (int i = 0; i < 3000; ++i) {
          if (!mine.empty() && (rng() % 2 == 0 || mine.size() > 8)) {
            release(mine.back());
            mine.pop_back();
            continue;
          }
          std::size_t bytes = 256 * scale * (1 + rng() % 16);
          vram::tenant leaf = leaves[rng() % 3];
          ledger.intend(leaf, bytes, true);
          std::uint64_t seen = ledger.changes.load();
          try {
            void* p = q.allocate(vram::stream_ref{}, bytes, 256, leaf);
            granted.fetch_add(1);
            ledger.for_chain(leaf, [&](vram::tenant x) {
              if (ledger.held[x.id].fetch_add(bytes) + bytes > hard[x.id]) ledger.over_limit.fetch_add(1);
            });
            mine.push_back({p, bytes, leaf});
          } catch (const vram::quota_exceeded& e) {  // Catch's macros are not thread-safe: count here
            refused.fetch_add(1);
            bool in_chain = false;
            ledger.for_chain(leaf, [&](vram::tenant x) { in_chain = in_chain || x.id == e.limited_tenant().id; });
            if (!in_chain || e.limit() != hard[e.limited_tenant().id]) ledger.foreign_refusals.fetch_add(1);
            std::size_t intents_then = ledger.intents[e.limited_tenant().id].load();
            if (ledger.still(seen)) {  // nobody else moved during the call: intents_then is exact
              ledger.verified_refusals.fetch_add(1);
              if (intents_then <= hard[e.limited_tenant().id]) ledger.unjustified_refusals.fetch_add(1);
            }
            ledger.intend(leaf, bytes, false);
          }
        }
        for (auto& h : mine) release(h);
      });
    for (auto& th : threads) th.join();
    CHECK(granted > 0);
    CHECK(refused > 0);
    CHECK(ledger.over_limit == 0);
    CHECK(ledger.foreign_refusals == 0);
    CHECK(ledger.verified_refusals > 0);  // the refusal check ran
    CHECK(ledger.unjustified_refusals == 0);
    for (std::uint32_t i = 0; i < t.reg->size(); ++i) CHECK(q.usage(vram::tenant{i}) == 0);
    CHECK(q.peak_usage(t.job) <= 16 * 1024 * scale);
    CHECK(q.peak_usage(t.layer) <= 6 * 1024 * scale);
    CHECK(q.peak_usage(t.model_a) <= 10 * 1024 * scale);
    q.check_invariants();
  }
  CHECK(up.counters().live_allocations() == 0);
  CHECK(up.counters().peak_live_bytes <= 16 * 1024 * scale);  // the upstream's own record: the job's limit
}
}  // namespace

TEST_CASE("quota_adaptor: threads racing at the limit never exceed it, and refuse only what does not fit",
          "[adaptor][quota][race]") {
  race_at_the_limit(1);
}

TEST_CASE("quota_adaptor: threads racing with credit never exceed a limit, and refuse only what does not fit",
          "[adaptor][quota][race]") {
  // Requests of 128 KiB - 2 MiB under limits of 3 - 8 MiB: credit batches (1 MiB) fit far from
  // the limits and not near them, so requests are served from credit, from the book, and
  // refused after every thread's credit was taken back.
  STATIC_REQUIRE(vram::quota_adaptor<upstream_t>::credit_batch == std::size_t{1} << 20);
  race_at_the_limit(512);
}

TEST_CASE("quota_adaptor: credit serves a thread's requests; usage, peaks and counts stay exact", "[adaptor][quota][credit]") {
  tree t;
  upstream_t up;
  using quota_t = vram::quota_adaptor<upstream_t>;
  constexpr std::size_t batch = quota_t::credit_batch;
  quota_t q(up, t.reg);
  q.set_hard_limit(t.job, 64 * batch);  // far above: the first request takes a batch of credit
  void* a = q.allocate(vram::stream_ref{}, 4096, 256, t.layer);
  CHECK(q.book().usage(t.layer) == 4096 + batch);  // the book holds the credit too
  CHECK(q.usage(t.layer) == 4096);                  // usage does not
  CHECK(q.usage(t.job) == 4096);
  std::vector<void*> held;
  for (int i = 0; i < 100; ++i) held.push_back(q.allocate(vram::stream_ref{}, 1000, 256, t.layer));
  CHECK(q.book().usage(t.job) == 4096 + batch);  // 100 requests served from the credit
  CHECK(q.usage(t.model_a) == 4096 + 100 * 1000);
  CHECK(q.peak_usage(t.job) == 4096 + 100 * 1000);
  CHECK(q.peak_usage(t.layer) == 4096 + 100 * 1000);
  CHECK(q.stats().peak_requested_bytes == 4096 + 100 * 1000);
  CHECK(q.stats().live_allocations == 101);
  q.check_invariants();
  for (void* p : held) q.deallocate_sync(p, 1000);
  q.deallocate_sync(a, 4096);
  CHECK(q.usage(t.job) == 0);
  CHECK(q.peak_usage(t.job) == 4096 + 100 * 1000);
  CHECK(q.stats().live_allocations == 0);
  q.check_invariants();

  // Frees give back to the credit, which keeps at most two batches: a burst of 3 batches
  // leaves one in the book when it is freed.
  for (int i = 0; i < 3; ++i) held[i] = q.allocate(vram::stream_ref{}, batch, 256, t.layer);
  for (int i = 0; i < 3; ++i) q.deallocate_sync(held[i], batch);
  CHECK(q.usage(t.job) == 0);
  CHECK(q.book().usage(t.job) == batch);
  CHECK(q.peak_usage(t.job) == 3 * batch);

  // Another tenant: the credit moves to it.
  void* b = q.allocate(vram::stream_ref{}, 512, 256, t.model_b);
  CHECK(q.book().usage(t.layer) == 0);
  CHECK(q.book().usage(t.model_b) == 512 + batch);
  CHECK(q.usage(t.job) == 512);
  // Setting a limit takes all credit back.
  q.set_hard_limit(t.model_b, 1024);
  CHECK(q.book().usage(t.job) == 512);
  CHECK_THROWS_AS(q.allocate(vram::stream_ref{}, 1024, 256, t.model_b), vram::quota_exceeded);
  void* c = q.allocate(vram::stream_ref{}, 512, 256, t.model_b);  // exactly at the limit
  CHECK(q.usage(t.model_b) == 1024);
  CHECK(q.refusals(t.model_b) == 1);
  q.check_invariants();
  q.deallocate_sync(b, 512);
  q.deallocate_sync(c, 512);
  CHECK(q.usage(t.job) == 0);
  q.check_invariants();
  CHECK(up.counters().live_allocations() == 0);
}

TEST_CASE("quota_adaptor: a tenant with a soft limit on its chain, or a chain deeper than a shard keeps, gets no credit", "[adaptor][quota][credit]") {
  tree t;
  upstream_t up;
  vram::quota_adaptor<upstream_t> q(up, t.reg);
  q.set_soft_limit(t.job, std::size_t{1} << 30);
  void* a = q.allocate(vram::stream_ref{}, 4096, 256, t.layer);
  CHECK(q.book().usage(t.job) == 4096);  // charged exactly: each soft crossing is seen
  vram::tenant deep = t.layer;
  for (int i = 0; i < 8; ++i) deep = t.reg->create("level" + std::to_string(i), deep);  // 11 levels
  void* b = q.allocate(vram::stream_ref{}, 4096, 256, deep);
  q.set_soft_limit(t.job, decltype(q)::unlimited);
  void* c = q.allocate(vram::stream_ref{}, 4096, 256, deep);
  CHECK(q.book().usage(t.job) == 3 * 4096);  // too deep to cache its chain: charged exactly
  CHECK(q.usage(deep) == 2 * 4096);
  CHECK(q.peak_usage(deep) == 2 * 4096);
  q.check_invariants();
  for (void* p : {a, b, c}) q.deallocate_sync(p, 4096);
  CHECK(q.usage(t.job) == 0);
  q.check_invariants();
}

TEST_CASE("quota_adaptor: credit idle on another thread never refuses a request that fits", "[adaptor][quota][credit]") {
  tree t;
  upstream_t up;
  using quota_t = vram::quota_adaptor<upstream_t>;
  constexpr std::size_t batch = quota_t::credit_batch;
  quota_t q(up, t.reg);
  q.set_hard_limit(t.job, 4 * batch);
  std::mutex m;
  std::condition_variable cv;
  int phase = 0;
  void* theirs = nullptr;
  std::thread other([&] {
    void* p = q.allocate(vram::stream_ref{}, 4096, 256, t.layer);  // takes a batch of credit
    q.deallocate_sync(p, 4096);                                     // and keeps it
    theirs = q.allocate(vram::stream_ref{}, 8192, 256, t.layer);   // live, freed by the main thread
    std::unique_lock lock(m);
    phase = 1;
    cv.notify_all();
    cv.wait(lock, [&] { return phase == 2; });  // alive and idle, holding its credit
  });
  {
    std::unique_lock lock(m);
    cv.wait(lock, [&] { return phase == 1; });
  }
  CHECK(q.usage(t.job) == 8192);
  CHECK(q.book().usage(t.job) > 8192 + batch / 2);  // the other thread's credit
  // 4 batches less 8 KiB fit exactly: refused first while the credit is out, then granted.
  void* mine = q.allocate(vram::stream_ref{}, 4 * batch - 8192, 256, t.model_b);
  CHECK(q.usage(t.job) == 4 * batch);
  CHECK(q.refusals(t.job) == 0);  // a refusal counts only once the credit was taken back
  CHECK_THROWS_AS(q.allocate(vram::stream_ref{}, 1, 256, t.model_b), vram::quota_exceeded);
  CHECK(q.refusals(t.job) == 1);
  q.deallocate_sync(theirs, 8192);  // a block another thread made: its record is found there
  CHECK(q.usage(t.layer) == 0);
  CHECK(q.owns(mine));
  CHECK_FALSE(q.owns(theirs));
  q.check_invariants();
  {
    std::lock_guard lock(m);
    phase = 2;
  }
  cv.notify_all();
  other.join();
  q.deallocate_sync(mine, 4 * batch - 8192);
  CHECK(q.usage(t.job) == 0);
  q.check_invariants();
  CHECK(up.counters().live_allocations() == 0);
}

namespace {
/// Host memory whose frees wait, inside the upstream, until the test opens the gate.
struct gated_frees {
  struct gate {
    std::mutex m;
    std::condition_variable cv;
    bool entered = false, open = false;
  };
  std::shared_ptr<gate> g = std::make_shared<gate>();
  vram::host_source host;
  void* allocate(vram::stream_ref s, std::size_t bytes, std::size_t align) { return host.allocate(s, bytes, align); }
  void deallocate(vram::stream_ref s, void* p, std::size_t bytes, std::size_t align) noexcept {
    {
      std::unique_lock lock(g->m);
      g->entered = true;
      g->cv.notify_all();
      g->cv.wait(lock, [&] { return g->open; });
    }
    host.deallocate(s, p, bytes, align);
  }
  void* allocate_sync(std::size_t bytes, std::size_t align = 256) { return allocate({}, bytes, align); }
  void deallocate_sync(void* p, std::size_t bytes, std::size_t align = 256) noexcept { deallocate({}, p, bytes, align); }
  friend bool operator==(const gated_frees& a, const gated_frees& b) { return a.g == b.g; }
};
}  // namespace

TEST_CASE("quota_adaptor: a free's bytes serve no request before the upstream freed the block", "[adaptor][quota][credit]") {
  tree t;
  using quota_t = vram::quota_adaptor<gated_frees>;
  constexpr std::size_t batch = quota_t::credit_batch;
  gated_frees up;
  quota_t q(up, t.reg);
  q.set_hard_limit(t.job, 4 * batch);
  // One thread allocates a block (taking a batch of credit too) and frees it: the bytes go
  // back to its credit at once, in flight while the upstream frees the block.
  std::thread freeing([&] {
    void* a = q.allocate(vram::stream_ref{}, batch, 256, t.layer);
    q.deallocate_sync(a, batch);
  });
  {
    std::unique_lock lock(up.g->m);
    up.g->cv.wait(lock, [&] { return up.g->entered; });  // the free is inside the upstream
  }
  CHECK(q.book().usage(t.job) == 2 * batch);
  CHECK(q.usage(t.job) == batch);  // still held
  // Another thread asks for all that is not held: refused first (the credit is out), then
  // every credit is taken back but the block in flight, and the request fits exactly.
  void* b = q.allocate(vram::stream_ref{}, 3 * batch, 256, t.model_b);
  CHECK(q.usage(t.job) == 4 * batch);
  CHECK_THROWS_AS(q.allocate(vram::stream_ref{}, 1, 256, t.model_b), vram::quota_exceeded);
  {
    std::lock_guard lock(up.g->m);
    up.g->open = true;
  }
  up.g->cv.notify_all();
  freeing.join();
  CHECK(q.usage(t.job) == 3 * batch);
  void* c = q.allocate(vram::stream_ref{}, batch, 256, t.model_b);  // the freed block's bytes
  CHECK(q.usage(t.job) == 4 * batch);
  q.check_invariants();
  q.deallocate_sync(b, 3 * batch);
  q.deallocate_sync(c, batch);
  CHECK(q.usage(t.job) == 0);
  q.check_invariants();
}

TEST_CASE("quota_adaptor: blocks handed between threads keep their data, ranges stay disjoint", "[adaptor][quota][credit]") {
  // Four threads allocate blocks, fill each with a pattern of its own and pass it on to the
  // next thread, which checks the pattern and the live ranges before it frees the block.
  tree t;
  upstream_t up;
  vram::quota_adaptor<upstream_t> q(up, t.reg);
  q.set_hard_limit(t.job, std::size_t{64} << 20);
  constexpr int threads_n = 4, rounds = 2000;
  struct block {
    unsigned char* p;
    std::size_t bytes;
    unsigned char pattern;
  };
  std::mutex m;
  std::vector<std::vector<block>> inbox(threads_n);
  std::map<std::uintptr_t, std::size_t> live;  // start -> bytes, under m
  std::atomic<int> corrupted{0}, overlaps{0};
  auto check_and_free = [&](const block& b) {
    for (std::size_t i = 0; i < b.bytes; ++i)
      if (b.p[i] != b.pattern) {
        corrupted.fetch_add(1);
        break;
      }
    {
      std::lock_guard lock(m);
      live.erase(reinterpret_cast<std::uintptr_t>(b.p));
    }
    q.deallocate_sync(b.p, b.bytes);
  };
  std::vector<std::thread> threads;
  for (int th = 0; th < threads_n; ++th)
    threads.emplace_back([&, th] {
      std::mt19937 rng(static_cast<unsigned>(th + 100));
      const vram::tenant leaves[] = {t.layer, t.model_a, t.model_b};
      for (int i = 0; i < rounds; ++i) {
        std::size_t bytes = 256 * (1 + rng() % 64);
        auto* p = static_cast<unsigned char*>(q.allocate(vram::stream_ref{}, bytes, 256, leaves[rng() % 3]));
        auto pattern = static_cast<unsigned char>(rng());
        {
          std::lock_guard lock(m);
          auto a = reinterpret_cast<std::uintptr_t>(p);
          auto next = live.lower_bound(a);
          if (next != live.end() && next->first < a + bytes) overlaps.fetch_add(1);
          if (next != live.begin() && std::prev(next)->first + std::prev(next)->second > a) overlaps.fetch_add(1);
          live[a] = bytes;
        }
        std::memset(p, pattern, bytes);
        std::vector<block> mine;
        {
          std::lock_guard lock(m);
          inbox[(th + 1) % threads_n].push_back({p, bytes, pattern});
          mine.swap(inbox[th]);
        }
        for (auto& b : mine) check_and_free(b);
      }
    });
  for (auto& th : threads) th.join();
  for (auto& box : inbox)
    for (auto& b : box) check_and_free(b);
  CHECK(corrupted == 0);
  CHECK(overlaps == 0);
  for (std::uint32_t i = 0; i < t.reg->size(); ++i) CHECK(q.usage(vram::tenant{i}) == 0);
  CHECK(q.stats().live_allocations == 0);
  CHECK(q.stats().total_allocations == threads_n * rounds);
  q.check_invariants();
  CHECK(up.counters().live_allocations() == 0);
}

TEST_CASE("quota_adaptor: upstream failure rolls back every level", "[adaptor][quota]") {
  tree t;
  upstream_t up;
  vram::quota_adaptor<upstream_t> q(up, t.reg);
  CHECK_THROWS_AS(q.allocate(vram::stream_ref{}, std::size_t{1} << 52, 256, t.layer), vram::out_of_memory);
  CHECK(q.usage(t.layer) == 0);
  CHECK(q.usage(t.job) == 0);
  CHECK(q.stats().ooms == 1);
  q.check_invariants();
}
