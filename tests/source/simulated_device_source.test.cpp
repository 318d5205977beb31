// simulated_device_source's own behaviour: capacity accounting at the granularity, placement
// at the lowest free address, and, in contiguous mode, freeing any granule-aligned piece.
#include <catch2/catch.hpp>

#include <cstdint>

#include <vram/source/simulated_device_source.hpp>

#include "support/misuse_capture.hpp"

namespace {
constexpr std::size_t MiB = std::size_t{1} << 20;
std::uintptr_t addr(void* p) { return reinterpret_cast<std::uintptr_t>(p); }
}  // namespace

TEST_CASE("simulated device: capacity is counted in granules and enforced", "[source][simulated]") {
  vram::simulated_device_source device(vram::simulated_device_options{.capacity = 8 * MiB, .granularity = 2 * MiB});
  void* a = device.allocate_sync(1);  // one whole granule
  CHECK(device.stats().reserved_bytes == 2 * MiB);
  CHECK(device.stats().live_bytes == 1);
  void* b = device.allocate_sync(6 * MiB);
  CHECK(device.stats().reserved_bytes == 8 * MiB);
  CHECK_THROWS_AS(device.allocate_sync(1), vram::out_of_memory);
  CHECK(device.stats().ooms == 1);
  device.deallocate_sync(a, 1);
  void* c = device.allocate_sync(2 * MiB);
  CHECK(c == a);  // lowest free address first
  device.deallocate_sync(b, 6 * MiB);
  device.deallocate_sync(c, 2 * MiB);
  CHECK(device.stats().reserved_bytes == 0);
  CHECK(device.stats().peak_reserved_bytes == 8 * MiB);
}

TEST_CASE("simulated device: addresses are aligned to the granularity and owned", "[source][simulated]") {
  vram::simulated_device_source device(vram::simulated_device_options{.capacity = 64 * MiB, .granularity = 2 * MiB});
  void* p = device.allocate_sync(3 * MiB);
  CHECK(addr(p) % (2 * MiB) == 0);
  CHECK(device.owns(p));
  CHECK(device.owns(static_cast<char*>(p) + 4 * MiB - 1));  // inside the rounded range
  CHECK_FALSE(device.owns(static_cast<char*>(p) + 4 * MiB));
  CHECK_THROWS_AS(device.allocate_sync(10, 4 * MiB), vram::invalid_argument);  // above the granularity
  device.deallocate_sync(p, 3 * MiB);
  CHECK_FALSE(device.owns(p));
}

TEST_CASE("simulated device, contiguous: pieces of live memory are freed on their own", "[source][simulated]") {
  vram::test::misuse_capture capture;
  vram::simulated_device_source device(
      vram::simulated_device_options{.capacity = 64 * MiB, .granularity = 2 * MiB, .contiguous = true});
  void* a = device.allocate_sync(8 * MiB);
  void* b = device.allocate_sync(8 * MiB);
  CHECK(addr(b) == addr(a) + 8 * MiB);  // growth is adjacent
  // Free a range spanning the end of a and the start of b: both are cut.
  device.deallocate_sync(reinterpret_cast<void*>(addr(a) + 6 * MiB), 4 * MiB);
  CHECK(capture.count() == 0);
  CHECK(device.stats().reserved_bytes == 12 * MiB);
  CHECK_FALSE(device.owns(reinterpret_cast<void*>(addr(a) + 7 * MiB)));
  CHECK(device.owns(reinterpret_cast<void*>(addr(a) + 5 * MiB)));
  // A piece that is not granule-aligned, or not live, is misuse and changes nothing.
  device.deallocate_sync(reinterpret_cast<void*>(addr(a) + 1), 2 * MiB);
  device.deallocate_sync(reinterpret_cast<void*>(addr(a) + 6 * MiB), 2 * MiB);  // already free
  CHECK(capture.count() == 2);
  CHECK(device.stats().reserved_bytes == 12 * MiB);
  // The rest goes back in pieces; the device ends empty and whole again.
  device.deallocate_sync(a, 6 * MiB);
  device.deallocate_sync(reinterpret_cast<void*>(addr(a) + 10 * MiB), 6 * MiB);
  CHECK(device.stats().reserved_bytes == 0);
  CHECK(device.stats().live_allocations == 0);
  void* whole = device.allocate_sync(64 * MiB);  // the free ranges coalesced
  CHECK(whole == a);
  device.deallocate_sync(whole, 64 * MiB);
}

TEST_CASE("simulated device: bad configurations are invalid arguments", "[source][simulated]") {
  CHECK_THROWS_AS(vram::simulated_device_source(vram::simulated_device_options{.capacity = MiB, .granularity = 3000}),
                  vram::invalid_argument);
  CHECK_THROWS_AS(vram::simulated_device_source(vram::simulated_device_options{.capacity = 0}), vram::invalid_argument);
}
