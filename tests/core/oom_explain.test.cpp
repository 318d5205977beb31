// vram::out_of_memory explains itself: each cause built on purpose (exhaustion,
// fragmentation, stranding on another stream, a pool's cap, a tenant's quota), and the
// explanation names it and what would have served the request; through a tracker_adaptor it
// also names who held the memory.
#include <catch2/catch.hpp>

#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include <vram/adaptor/quota_adaptor.hpp>
#include <vram/adaptor/tracker_adaptor.hpp>
#include <vram/alloc/stream_pool.hpp>
#include <vram/core/error.hpp>
#include <vram/core/host_stream.hpp>
#include <vram/core/ref.hpp>
#include <vram/core/tag_scope.hpp>
#include <vram/core/tenant.hpp>
#include <vram/source/host_source.hpp>
#include <vram/source/simulated_device_source.hpp>

#include "support/recording_resource.hpp"

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

using pool_t = vram::stream_pool<vram::simulated_device_source>;

/// A 64 MiB device, taken by the pool in one chunk.
pool_t small_pool(std::size_t maximum = 0) {
  return pool_t(vram::simulated_device_source(vram::simulated_device_options{.capacity = 64 * MiB}),
                vram::stream_pool_options{.maximum_size = maximum, .growth_step = 64 * MiB});
}

/// Keeps a host stream busy until opened (at the latest when it goes out of scope, so a
/// failed check cannot leave the stream's worker blocked and its destructor waiting).
class gate {
 public:
  explicit gate(vram::host_stream& s) { s.enqueue([f = opened_.get_future().share()] { f.wait(); }); }
  gate(const gate&) = delete;
  gate& operator=(const gate&) = delete;
  ~gate() { open(); }
  void open() {
    if (!open_) opened_.set_value();
    open_ = true;
  }

 private:
  std::promise<void> opened_;
  bool open_ = false;
};

/// How an explanation names a stream: its key (a host_stream's address, a CUDA stream's handle).
std::string stream_name(vram::host_stream& s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "stream 0x%" PRIxPTR, vram::stream_ref(s).key());
  return buf;
}

/// The out_of_memory `f` throws.
template <class F>
std::string explained(F&& f, vram::out_of_memory::reason expected) {
  try {
    f();
  } catch (const vram::out_of_memory& e) {
    CHECK(e.cause() == expected);
    std::string text = e.explain();
    INFO(text);
    CHECK(text.find("cause: ") != std::string::npos);
    CHECK(text.find("would serve it: ") != std::string::npos);
    return text;
  }
  FAIL("no out_of_memory");
  return {};
}

}  // namespace

TEST_CASE("exhaustion: nothing free holds it and the device has no more") {
  pool_t pool = small_pool();
  void* a = pool.allocate_sync(48 * MiB);
  std::string text = explained([&] { (void)pool.allocate_sync(32 * MiB); }, vram::out_of_memory::reason::exhausted);
  CHECK(text.find("32.00 MiB requested") != std::string::npos);
  CHECK(text.find("exhaustion") != std::string::npos);
  pool.deallocate_sync(a, 48 * MiB);
  pool.check_invariants();
}

TEST_CASE("fragmentation: enough free bytes, no block large enough") {
  pool_t pool = small_pool();
  std::vector<void*> blocks;
  for (int i = 0; i < 16; ++i) blocks.push_back(pool.allocate_sync(4 * MiB));  // the whole device
  for (int i = 0; i < 16; i += 2) pool.deallocate_sync(blocks[i], 4 * MiB);   // 32 MiB free, in 4 MiB holes
  std::string text = explained([&] { (void)pool.allocate_sync(8 * MiB); }, vram::out_of_memory::reason::fragmented);
  CHECK(text.find("fragmentation") != std::string::npos);
  CHECK(text.find("the largest 4.00 MiB") != std::string::npos);
  CHECK(text.find("cuda_vmm_source") != std::string::npos);
  for (int i = 1; i < 16; i += 2) pool.deallocate_sync(blocks[i], 4 * MiB);
  pool.check_invariants();
}

TEST_CASE("stranding: a busy stream's free block beside ours does not merge until that stream is done") {
  // Over a full 64 MiB device, and under a 64 MiB cap on a larger one: stranding is named
  // before the cap, as waiting for the stream serves the request without a larger cap.
  auto [capacity, maximum] = GENERATE(table<std::size_t, std::size_t>({{64 * MiB, 0}, {256 * MiB, 64 * MiB}}));
  INFO("device " << capacity / MiB << " MiB, maximum_size " << maximum / MiB << " MiB");
  using recorded_pool = vram::stream_pool<vram::test::recording_resource<vram::simulated_device_source>>;
  vram::test::recording_resource<vram::simulated_device_source> device(
      vram::simulated_device_source(vram::simulated_device_options{.capacity = capacity}));
  vram::host_stream a, b;
  {
    recorded_pool pool(device, vram::stream_pool_options{.maximum_size = maximum, .growth_step = 64 * MiB});  // one chunk
    void* x = pool.allocate(a, 24 * MiB);
    void* y = pool.allocate(b, 24 * MiB);
    void* z = pool.allocate_sync(16 * MiB);  // the rest of the chunk
    auto address = [](void* p) { return reinterpret_cast<std::uintptr_t>(p); };  // simulated: not readable memory
    REQUIRE(address(y) == address(x) + 24 * MiB);                           // adjacent
    gate busy(b);                     // b has queued work from here on
    pool.deallocate(a, x, 24 * MiB);  // keyed to a, which is idle
    pool.deallocate(b, y, 24 * MiB);  // keyed to b: reusable by a only after b's queued work
    pool.check_invariants();

    // 40 MiB: more than either free block, less than the two together.
    vram::stream_stranding stranded;
    std::string text = explained(
        [&] {
          try {
            (void)pool.allocate(a, 40 * MiB);
          } catch (const vram::out_of_memory& e) {
            stranded = e.stranded();
            throw;
          }
        },
        vram::out_of_memory::reason::stranded);
    CHECK(text.find("48.00 MiB free inside it in 2 blocks, the largest 24.00 MiB") != std::string::npos);
    CHECK(text.find("cause: stranding: 24.00 MiB of its free blocks are keyed to 1 other stream") != std::string::npos);
    CHECK(text.find("its largest run of adjacent free blocks is 48.00 MiB") != std::string::npos);
    CHECK(text.find("stranded: " + stream_name(b) + " holds 24.00 MiB free (largest block 24.00 MiB).") !=
          std::string::npos);
    CHECK(text.find("would serve it: waiting for " + stream_name(b)) != std::string::npos);
    CHECK(text.find(stream_name(a)) == std::string::npos);  // the requesting stream strands nothing
    REQUIRE(stranded.listed == 1);
    CHECK(stranded.streams == 1);
    CHECK(stranded.stream[0].stream_key == vram::stream_ref(b).key());
    CHECK(stranded.stream[0].free_bytes == 24 * MiB);
    CHECK(stranded.largest_run == 48 * MiB);
    pool.check_invariants();

    busy.open();
    b.synchronize();  // b's work is done: its free block merges with x's when the request comes again
    void* w = pool.allocate(a, 40 * MiB);
    CHECK(address(w) == address(x));
    pool.check_invariants();
    pool.deallocate(a, w, 40 * MiB);
    pool.deallocate_sync(z, 16 * MiB);
    a.synchronize();
    pool.check_invariants();
    CHECK(pool.stats().live_bytes == 0);
  }
  CHECK(device.counters().live_bytes == 0);  // the pool gave back everything it took
  CHECK(device.counters().live_allocations() == 0);
}

TEST_CASE("stranding: the explanation lists the streams with the most free bytes and counts the rest") {
  vram::stream_stranding st;
  st.streams = 6;
  st.largest_run = 96 * MiB;
  for (std::size_t i = 0; i < st.stream.size(); ++i) st.stream[i] = {0x1000 * (i + 1), (8 - i) * MiB, 4 * MiB};
  st.listed = st.stream.size();
  st.bytes = (8 + 7 + 6 + 5 + 4 + 3) * MiB;
  vram::out_of_memory e("stream_pool", 64 * MiB, vram::stream_ref{}, vram::stats{}, 0, "maximum_size", st);
  CHECK(e.cause() == vram::out_of_memory::reason::stranded);
  std::string text = e.explain();
  INFO(text);
  CHECK(text.find("33.00 MiB of its free blocks are keyed to 6 other streams") != std::string::npos);
  CHECK(text.find("stream 0x1000 holds 8.00 MiB free (largest block 4.00 MiB); stream 0x2000 holds 7.00 MiB") !=
        std::string::npos);
  CHECK(text.find("stream 0x4000 holds 5.00 MiB free (largest block 4.00 MiB); and 2 more streams.") !=
        std::string::npos);
  CHECK(text.find("waiting for stream 0x1000, stream 0x2000, stream 0x3000, stream 0x4000 and the 2 others "
                  "(synchronize them") != std::string::npos);

  st.largest_run = 32 * MiB;  // merged, still too small: not stranding
  CHECK(vram::out_of_memory("stream_pool", 64 * MiB, vram::stream_ref{}, vram::stats{}, 0, "maximum_size", st).cause() ==
        vram::out_of_memory::reason::exhausted);
}

TEST_CASE("a cap: the pool's maximum_size leaves less room than the request") {
  pool_t pool = small_pool(16 * MiB);
  std::string text = explained([&] { (void)pool.allocate_sync(32 * MiB); }, vram::out_of_memory::reason::capped);
  CHECK(text.find("maximum_size (16.00 MiB)") != std::string::npos);
  pool.check_invariants();
}

TEST_CASE("a quota: the tenant, its usage and limit, and the limit that would serve it") {
  auto reg = std::make_shared<vram::tenant_registry>();
  vram::tenant t = reg->create("trainer");
  vram::quota_adaptor<vram::host_source> q(vram::host_source{}, reg);
  q.set_hard_limit(t, 3 * MiB);
  vram::tenant_scope scope(t);
  void* a = q.allocate_sync(2 * MiB);
  std::string text = explained([&] { (void)q.allocate_sync(2 * MiB); }, vram::out_of_memory::reason::quota);
  CHECK(text.find("tenant 'trainer'") != std::string::npos);
  CHECK(text.find("uses 2.00 MiB of its 3.00 MiB hard limit") != std::string::npos);
  CHECK(text.find("at least 4.00 MiB") != std::string::npos);
  q.deallocate_sync(a, 2 * MiB);
  q.check_invariants();
}

TEST_CASE("a quota: freeing is proposed only up to what the tenant holds") {
  auto reg = std::make_shared<vram::tenant_registry>();
  vram::tenant bob = reg->create("bob");
  vram::quota_adaptor<vram::host_source> q(vram::host_source{}, reg);
  q.set_hard_limit(bob, 8 * MiB);
  vram::tenant_scope scope(bob);
  const std::string name = "tenant 'bob' (id " + std::to_string(bob.id) + ")";
  {  // a request above the limit itself, nothing held: no freeing can serve it
    std::string text = explained([&] { (void)q.allocate_sync(16 * MiB); }, vram::out_of_memory::reason::quota);
    INFO(text);
    CHECK(text.find("16.00 MiB requested by " + name + ".") != std::string::npos);
    CHECK(text.find("the request alone is larger than that limit") != std::string::npos);
    CHECK(text.find("a hard limit of at least 16.00 MiB for " + name) != std::string::npos);
    CHECK(text.find("pieces live at once of at most 8.00 MiB.") != std::string::npos);
    CHECK(text.find("freeing") == std::string::npos);
    CHECK(text.find("tenant id") == std::string::npos);
  }
  void* a = q.allocate_sync(3 * MiB);
  {  // above the limit, 3 MiB held: the room left now, all of it once freed
    std::string text = explained([&] { (void)q.allocate_sync(16 * MiB); }, vram::out_of_memory::reason::quota);
    INFO(text);
    CHECK(text.find("at most 5.00 MiB (8.00 MiB once " + name + " frees what it holds).") != std::string::npos);
  }
  {  // within the limit: freeing what is missing, which the tenant holds
    std::string text = explained([&] { (void)q.allocate_sync(6 * MiB); }, vram::out_of_memory::reason::quota);
    INFO(text);
    CHECK(text.find("or freeing 1.00 MiB of the 3.00 MiB that " + name + " holds.") != std::string::npos);
  }
  q.deallocate_sync(a, 3 * MiB);
  q.check_invariants();
}

TEST_CASE("a quota: a child's request refused by its parent's limit names both tenants the same way") {
  auto reg = std::make_shared<vram::tenant_registry>();
  vram::tenant team = reg->create("team");
  vram::tenant alice = reg->create("alice", team);
  vram::quota_adaptor<vram::host_source> q(vram::host_source{}, reg);
  q.set_hard_limit(team, 4 * MiB);
  vram::tenant_scope scope(alice);
  void* a = q.allocate_sync(3 * MiB);
  try {
    (void)q.allocate_sync(2 * MiB);
    FAIL("no quota_exceeded");
  } catch (const vram::quota_exceeded& e) {
    CHECK(std::string(e.requester_name()) == "alice");
    std::string text = e.explain();
    INFO(text);
    CHECK(text.find("requested by tenant 'alice' (id " + std::to_string(alice.id) + ").") != std::string::npos);
    CHECK(text.find("cause: tenant 'team' (id " + std::to_string(team.id) + ") uses 3.00 MiB of its 4.00 MiB") !=
          std::string::npos);
    CHECK(text.find("freeing 1.00 MiB of the 3.00 MiB that tenant 'team'") != std::string::npos);
    CHECK(std::string(e.what()).find("by tenant 'alice' (id " + std::to_string(alice.id) + ")") != std::string::npos);
  }
  q.deallocate_sync(a, 3 * MiB);
  q.check_invariants();
}

TEST_CASE("who holds the memory: a tracker names the top tenants and tags by live bytes") {
  auto reg = std::make_shared<vram::tenant_registry>();
  vram::tenant serving = reg->create("serving");
  vram::tenant llama = reg->create("llama", serving);
  vram::tenant train = reg->create("train");
  {
    pool_t pool = small_pool();
    vram::tracker_adaptor<vram::ref_t<pool_t>> tracker(vram::ref(pool), {.registry = reg});
    void *kv, *weights, *grads;
    {
      vram::tenant_scope scope(llama);
      vram::tag_scope tag("kv_cache");
      kv = tracker.allocate_sync(32 * MiB);
    }
    {
      vram::tenant_scope scope(train);
      vram::tag_scope tag("weights");
      weights = tracker.allocate_sync(12 * MiB);
      grads = tracker.allocate(vram::stream_ref{}, 4 * MiB, vram::default_alignment, llama);  // explicit tenant
    }
    vram::memory_holders holders;
    std::string text = explained(
        [&] {
          try {
            (void)tracker.allocate_sync(32 * MiB);
          } catch (const vram::out_of_memory& e) {
            holders = e.holders();
            throw;
          }
        },
        vram::out_of_memory::reason::exhausted);
    CHECK(text.find("\nheld by: tenant 'serving/llama' 36.00 MiB, 'train' 12.00 MiB; tags: 'kv_cache' 32.00 MiB, "
                    "'weights' 16.00 MiB.") != std::string::npos);
    CHECK(text.rfind("held by: ") > text.find("would serve it: "));  // the last line
    REQUIRE(holders.tenants == 2);
    CHECK(std::string(holders.tenant[0].name.data()) == "serving/llama");
    CHECK(holders.tenant[0].bytes == 36 * MiB);
    CHECK(holders.tags == 2);
    tracker.deallocate_sync(kv, 32 * MiB);
    tracker.deallocate_sync(weights, 12 * MiB);
    tracker.deallocate_sync(grads, 4 * MiB);
    tracker.check_invariants();
    CHECK(tracker.snapshot().live_bytes == 0);
  }
}

TEST_CASE("who holds the memory: a quota_exceeded passing through a tracker keeps its type and gains the line") {
  auto reg = std::make_shared<vram::tenant_registry>();
  vram::tenant t = reg->create("trainer");
  vram::tracker_adaptor<vram::quota_adaptor<vram::host_source>> tracker(
      vram::quota_adaptor<vram::host_source>(vram::host_source{}, reg), {.registry = reg});
  tracker.upstream().set_hard_limit(t, 3 * MiB);
  vram::tenant_scope scope(t);
  void* a = tracker.allocate_sync(2 * MiB);
  bool caught = false;
  try {
    (void)tracker.allocate_sync(2 * MiB);
  } catch (const vram::quota_exceeded& e) {  // still a quota_exceeded, not sliced to its base
    caught = true;
    CHECK(e.cause() == vram::out_of_memory::reason::quota);
    CHECK(std::string(e.tenant_name()) == "trainer");
    std::string text = e.explain();
    INFO(text);
    CHECK(text.find("cause: tenant 'trainer' (id 1) uses 2.00 MiB of its 3.00 MiB hard limit") != std::string::npos);
    CHECK(text.find("\nheld by: tenant 'trainer' 2.00 MiB.") != std::string::npos);  // untagged only: no tag list
  }
  CHECK(caught);
  CHECK(tracker.stats().ooms == 1);
  tracker.deallocate_sync(a, 2 * MiB);
  tracker.check_invariants();
}

TEST_CASE("who holds the memory: five of each are listed, the rest counted, long names cut") {
  vram::memory_holders h;
  std::string long_name(100, 'x');
  for (std::size_t i = 0; i < h.tenant.size(); ++i) {
    h.tenant[i].set_name(i == 0 ? long_name : "t" + std::to_string(i));
    h.tenant[i].bytes = (10 - i) * MiB;
  }
  h.tenants = h.tenant.size();
  h.total_tenants = 7;
  h.tag[0].set_name("kv_cache");
  h.tag[0].bytes = 30 * MiB;
  h.tag[1].set_name("");
  h.tag[1].bytes = 10 * MiB;
  h.tags = h.total_tags = 2;
  vram::budgets_exhausted e("budget_slab", MiB, vram::stream_ref{}, vram::stats{}, 8 * MiB, 8 * MiB);
  e.attach_holders(h);
  std::string text = e.explain();
  INFO(text);
  CHECK(std::string(h.tenant[0].name.data()) == std::string(60, 'x') + "...");
  CHECK(text.find("\nheld by: tenant '" + std::string(60, 'x') + "...' 10.00 MiB, 't1' 9.00 MiB") != std::string::npos);
  CHECK(text.find("'t4' 6.00 MiB, and 2 more; tags: 'kv_cache' 30.00 MiB, (untagged) 10.00 MiB.") != std::string::npos);
}
