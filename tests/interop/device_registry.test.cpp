// vram::device_registry: per-device resources, with fake device ids on the host.
#include <catch2/catch.hpp>

#include <thread>

#include <vram/alloc/stream_pool.hpp>
#include <vram/interop/device_registry.hpp>
#include <vram/source/simulated_device_source.hpp>

using namespace vram;

namespace {
thread_local int fake_current = 0;
int fake_current_device() { return fake_current; }

struct scoped_device {
  explicit scoped_device(int d) : previous(std::exchange(fake_current, d)) {}
  ~scoped_device() { fake_current = previous; }
  int previous;
};

// A device source that knows its device, like cuda_device_source.
struct numbered_source : simulated_device_source {
  explicit numbered_source(int d) : simulated_device_source(std::size_t{64} << 20), id(d) {}
  [[nodiscard]] int device() const noexcept { return id; }
  friend bool operator==(const numbered_source& a, const numbered_source& b) noexcept { return a.id == b.id; }
  int id;
};
}  // namespace

TEST_CASE("device_registry maps devices to their resources", "[interop][registry]") {
  using pool = stream_pool<simulated_device_source>;
  pool gpu0(simulated_device_source(std::size_t{256} << 20));
  pool gpu1(simulated_device_source(std::size_t{256} << 20));
  device_registry reg(2, &fake_current_device);
  CHECK(reg.device_count() == 2);
  CHECK(!reg.contains(0));
  CHECK_THROWS_AS(reg.get(0), vram::invalid_argument);  // nothing registered yet

  reg.set(0, gpu0);
  reg.set(1, gpu1);
  CHECK(reg.contains(1));
  CHECK(reg.get(0).device() == 0);
  CHECK(reg.get(0) == reg.get(0));
  CHECK(!(reg.get(0) == reg.get(1)));

  {
    scoped_device on(1);
    auto r = reg.get_current();
    void* p = r.allocate_sync(4096);
    CHECK(gpu1.owns(p));
    CHECK(!gpu0.owns(p));
    r.deallocate_sync(p, 4096);
  }
  {
    scoped_device on(0);
    void* p = reg.get_current().allocate(stream_ref{}, 1000);
    CHECK(gpu0.owns(p));
    // freeing from another current device is fine: the memory goes back to its owner
    scoped_device other(1);
    reg.get(0).deallocate(stream_ref{}, p, 1000);
    CHECK(!gpu0.owns(p));
  }
  CHECK(gpu0.stats().live_bytes == 0);
  CHECK(gpu1.stats().live_bytes == 0);
  gpu0.check_invariants();
  gpu1.check_invariants();

  reg.reset(1);
  CHECK(!reg.contains(1));
  CHECK_THROWS_AS(reg.get(1), vram::invalid_argument);
}

TEST_CASE("device_registry reports use on the wrong device", "[interop][registry]") {
  stream_pool<simulated_device_source> gpu1(simulated_device_source(std::size_t{256} << 20));
  device_registry reg(4, &fake_current_device);
  reg.set(1, gpu1);
  scoped_device on(3);
  auto r = reg.get(1);
  try {
    (void)r.allocate_sync(256);
    FAIL("allocating from device 1's resource on device 3 must throw");
  } catch (const wrong_device& e) {
    CHECK(e.expected_device() == 1);
    CHECK(e.current_device() == 3);
    CHECK(std::string(e.what()).find("device 1") != std::string::npos);
  }
  CHECK_THROWS_AS(r.allocate(stream_ref{}, 256), vram::invalid_argument);  // wrong_device is one
  CHECK(gpu1.stats().total_allocations == 0);  // the resource was never touched
}

TEST_CASE("device_registry rejects bad ids and mismatched resources", "[interop][registry]") {
  device_registry reg(2, &fake_current_device);
  numbered_source dev1(1);
  CHECK_THROWS_AS(reg.set(0, dev1), wrong_device);  // it says it is device 1
  reg.set(1, dev1);
  CHECK(reg.contains(1));
  CHECK_THROWS_AS(reg.get(2), vram::invalid_argument);
  CHECK_THROWS_AS(reg.get(-1), vram::invalid_argument);
  CHECK_THROWS_AS(reg.set(5, dev1), wrong_device);
  CHECK_THROWS_AS(device_registry(0, &fake_current_device), vram::invalid_argument);
}

TEST_CASE("device_registry is usable from several threads", "[interop][registry]") {
  using pool = stream_pool<simulated_device_source>;
  pool gpu0(simulated_device_source(std::size_t{256} << 20));
  pool gpu1(simulated_device_source(std::size_t{256} << 20));
  device_registry reg(2, &fake_current_device);
  reg.set(0, gpu0);
  reg.set(1, gpu1);
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      scoped_device on(t % 2);
      for (int i = 0; i < 500; ++i) {
        auto r = reg.get_current();
        void* p = r.allocate_sync(512 + 256 * (i % 7));
        if ((t % 2 == 0 ? gpu0 : gpu1).owns(p) == false) ++errors;
        r.deallocate_sync(p, 512 + 256 * (i % 7));
        if (i % 100 == 0) reg.set(t % 2, t % 2 == 0 ? gpu0 : gpu1);  // concurrent re-registration
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(errors == 0);
  CHECK(gpu0.stats().live_bytes == 0);
  CHECK(gpu1.stats().live_bytes == 0);
}
