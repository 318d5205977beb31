#pragma once
// The resources the conformance suite runs over. Each fixture makes one resource and says
// what can be checked on it. Add a fixture here when a resource lands, and list it below.

#include <cstddef>
#include <streambuf>
#include <ostream>
#include <tuple>
#include <vector>

#include <vram/adaptor/ledger_quota_adaptor.hpp>
#include <vram/adaptor/logging_adaptor.hpp>
#include <vram/adaptor/quota_adaptor.hpp>
#include <vram/adaptor/retry_adaptor.hpp>
#include <vram/adaptor/statistics_adaptor.hpp>
#include <vram/adaptor/tracker_adaptor.hpp>
#include <vram/alloc/activation_arena.hpp>
#include <vram/alloc/budget_slab.hpp>
#include <vram/alloc/planned_pool.hpp>
#include <vram/alloc/stream_pool.hpp>
#include <vram/adaptor/fault_injection_adaptor.hpp>
#include <vram/source/host_source.hpp>
#include <vram/source/simulated_device_source.hpp>

#include "support/scratch_ledger.hpp"

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

/// planned_pool serving from a plan: its warm-up step makes the allocations the suite's
/// alignment check makes (the same sizes, alignments and order), so that check is served from
/// the plan's range and the rest of the suite runs beside it, mostly off the plan.
struct planned_pool_fixture {
  static constexpr const char* name = "planned_pool<host_source> (serving a plan)";
  static constexpr bool host_accessible = true;
  struct served : planned_pool<host_source> {
    served() : planned_pool(host_source{}, {.online = {.growth_step = std::size_t{4} << 20}}) {
      mark_step();
      std::vector<std::tuple<void*, std::size_t, std::size_t>> blocks;
      for (std::size_t bytes : {1ul, 7ul, 256ul, 1000ul, 4096ul, 65536ul, 1ul << 20})
        for (std::size_t align : {8ul, 64ul, 256ul}) blocks.emplace_back(allocate_sync(bytes, align), bytes, align);
      for (auto [p, bytes, align] : blocks) deallocate_sync(p, bytes, align);
      mark_step();
      release();  // empty bins, as the other pools start (an OOM's flush would merge what they hold)
    }
  };
  static served make() { return served{}; }
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

struct statistics_adaptor_fixture {
  static constexpr const char* name = "statistics_adaptor<host_source>";
  static constexpr bool host_accessible = true;
  static statistics_adaptor<host_source> make() { return statistics_adaptor<host_source>(host_source{}); }
};

struct quota_adaptor_fixture {
  static constexpr const char* name = "quota_adaptor<host_source>";
  static constexpr bool host_accessible = true;
  static quota_adaptor<host_source> make() {
    quota_adaptor<host_source> q(host_source{}, std::make_shared<tenant_registry>());
    q.set_hard_limit(tenant::none(), std::size_t{1} << 40);
    return q;
  }
};

// Each resource charges a ledger of its own (in /dev/shm, removed at once: the handles keep
// its files mapped).
struct ledger_quota_adaptor_fixture {
  static constexpr const char* name = "ledger_quota_adaptor<host_source>";
  static constexpr bool host_accessible = true;
  static ledger_quota_adaptor<host_source> make() {
    scratch_ledger ledger;
    tenant t = ledger.admin().add_tenant("conformance/case");
    ledger.admin().set_hard_limit(ledger.admin().at("conformance"), std::size_t{1} << 40);
    return ledger_quota_adaptor<host_source>(host_source{}, {ledger.attach(), t});
  }
};

struct tracker_adaptor_fixture {
  static constexpr const char* name = "tracker_adaptor<host_source>";
  static constexpr bool host_accessible = true;
  static tracker_adaptor<host_source> make() { return tracker_adaptor<host_source>(host_source{}, {.event_capacity = 1024}); }
};

struct retry_adaptor_fixture {
  static constexpr const char* name = "retry_adaptor<host_source>";
  static constexpr bool host_accessible = true;
  static retry_adaptor<host_source> make() {
    retry_adaptor<host_source> r(host_source{}, {.max_retries = 2});
    r.add_reclaim([](std::size_t, stream_ref) -> std::size_t { return 0; });
    return r;
  }
};

struct logging_adaptor_fixture {
  static constexpr const char* name = "logging_adaptor<host_source>";
  static constexpr bool host_accessible = true;
  static logging_adaptor<host_source> make() {
    struct null_buffer : std::streambuf {
      int overflow(int c) override { return c; }
    };
    static null_buffer buffer;
    static std::ostream sink(&buffer);
    return logging_adaptor<host_source>(host_source{}, sink);
  }
};

struct fault_injection_adaptor_fixture {
  static constexpr const char* name = "fault_injection_adaptor<host_source> (no faults planned)";
  static constexpr bool host_accessible = true;
  static fault_injection_adaptor<host_source> make() { return fault_injection_adaptor<host_source>(host_source{}); }
};

/// Every host-side resource: the conformance suite runs on each.
using host_fixtures = std::tuple<host_source_fixture, simulated_device_fixture, simulated_contiguous_fixture,
                                 stream_pool_host_fixture, stream_pool_contiguous_fixture, planned_pool_fixture,
                                 activation_arena_fixture, budget_slab_fixture, statistics_adaptor_fixture,
                                 quota_adaptor_fixture, ledger_quota_adaptor_fixture, tracker_adaptor_fixture,
                                  retry_adaptor_fixture,
                                 logging_adaptor_fixture, fault_injection_adaptor_fixture>;

}  // namespace vram::test
