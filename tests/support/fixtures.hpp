#pragma once
// The resources the conformance suite runs over. Each fixture makes one resource and says
// what can be checked on it. Add a fixture here when a resource lands, and list it below.

#include <cstddef>
#include <tuple>

#include <vram/alloc/activation_arena.hpp>
#include <vram/alloc/budget_slab.hpp>
#include <vram/alloc/stream_pool.hpp>
#include <vram/source/host_source.hpp>
#include <vram/source/simulated_device_source.hpp>

namespace vram::test {

struct host_source_fixture {
  static constexpr const char* name = "host_source";
  static constexpr bool host_accessible = true;  // tests may write into the memory
  static host_source make() { return host_source{}; }
};

struct simulated_device_fixture {
  static constexpr const char* name = "simulated_device_source";
  static constexpr bool host_accessible = false;
  static simulated_device_source make() {
    return simulated_device_source(simulated_device_options{.capacity = std::size_t{1} << 30, .granularity = 256});
  }
};

struct simulated_contiguous_fixture {
  static constexpr const char* name = "simulated_device_source (contiguous)";
  static constexpr bool host_accessible = false;
  static simulated_device_source make() {
    return simulated_device_source(
        simulated_device_options{.capacity = std::size_t{1} << 30, .granularity = 4096, .contiguous = true});
  }
};

struct stream_pool_host_fixture {
  static constexpr const char* name = "stream_pool<host_source>";
  static constexpr bool host_accessible = true;
  static stream_pool<host_source> make() {
    return stream_pool<host_source>(host_source{}, stream_pool_options{.growth_step = std::size_t{4} << 20});
  }
};

struct stream_pool_contiguous_fixture {
  static constexpr const char* name = "stream_pool<simulated_device_source (contiguous)>";
  static constexpr bool host_accessible = false;
  static stream_pool<simulated_device_source> make() {
    return stream_pool<simulated_device_source>(simulated_device_source(simulated_device_options{
        .capacity = std::size_t{1} << 30, .granularity = std::size_t{64} << 10, .contiguous = true}));
  }
};

struct activation_arena_fixture {
  static constexpr const char* name = "activation_arena<host_source>";
  static constexpr bool host_accessible = true;
  static constexpr bool single_stream = true;  // bound to the synchronous stream, one thread
  static activation_arena<host_source> make() {
    return activation_arena<host_source>(host_source{}, stream_ref{}, {.chunk_bytes = std::size_t{1} << 20});
  }
};

struct budget_slab_fixture {
  static constexpr const char* name = "budget_slab<host_source, host_source>";
  static constexpr bool host_accessible = true;  // both sides are host memory here
  static budget_slab<host_source, host_source> make() {
    return budget_slab<host_source, host_source>(host_source{}, host_source{},
                                                 {.device_budget = std::size_t{2} << 20});
  }
};

/// Every host-side resource: the conformance suite runs on each.
using host_fixtures = std::tuple<host_source_fixture, simulated_device_fixture, simulated_contiguous_fixture,
                                 stream_pool_host_fixture, stream_pool_contiguous_fixture,
                                 activation_arena_fixture, budget_slab_fixture>;

}  // namespace vram::test
