#pragma once
// The C ABI's backends: per device, the allocator stack built from the config over its source
// (host, simulated, cuda), the ledger it charges, the table of live pointers (live_pointers.hpp),
// and the tenants by name. A room of vram_c_abi.cpp, included by it alone.

#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

#include <vram/vram_c.h>
#include <vram/adaptor/ledger_quota_adaptor.hpp>
#include <vram/adaptor/quota_adaptor.hpp>
#include <vram/adaptor/tracker_adaptor.hpp>
#include <vram/alloc/budget_slab.hpp>
#include <vram/alloc/planned_pool.hpp>
#include <vram/alloc/stream_pool.hpp>
#include <vram/core/error.hpp>
#include <vram/core/resource_ref.hpp>
#include <vram/core/tenant.hpp>
#include <vram/source/host_source.hpp>
#include <vram/source/simulated_device_source.hpp>
#if VRAM_HAS_CUDA
#  include <vram/detail/cuda_device_guard.hpp>
#  include <vram/source/cuda_device_source.hpp>
#  include <vram/source/cuda_pinned_source.hpp>
#endif

#include "environment.hpp"
#include "live_pointers.hpp"

namespace {

using namespace vram;

// ---- tenants (names -> ids, shared by all devices) ------------------------------------------

std::mutex tenants_mutex;
std::map<std::string, tenant, std::less<>> tenants_by_name;

tenant tenant_named(const std::string& name) {
  if (name.empty() || name == "default") return tenant{};
  std::lock_guard lock(tenants_mutex);
  auto it = tenants_by_name.find(name);
  if (it != tenants_by_name.end()) return it->second;
  tenant t = tenant_registry::global()->create(name);
  tenants_by_name.emplace(name, t);
  return t;
}

bool find_tenant(const char* name, tenant& out) {
  if (name == nullptr || *name == '\0' || std::strcmp(name, "default") == 0) {
    out = tenant{};
    return true;
  }
  std::lock_guard lock(tenants_mutex);
  auto it = tenants_by_name.find(name);
  if (it == tenants_by_name.end()) return false;
  out = it->second;
  return true;
}

// The thread's tenant from vram_set_tenant; unset: the configured VRAM_TENANT.
thread_local bool thread_tenant_set = false;
thread_local tenant thread_tenant{};

// ---- one device -----------------------------------------------------------------------------

/// The allocator at the bottom of the stack, owned through a type-erased handle, with the
/// capabilities the ABI needs captured at creation.
struct core {
  std::shared_ptr<void> owner;
  resource_ref<> ref;
  std::function<std::size_t()> release;
  std::function<vram::stats()> stats;
  std::function<plan_summary()> mark_step;  // planned_pool's; empty for the others
  std::function<plan_summary()> plan;
};

template <class R, class... Args>
core make_core(Args&&... args) {
  auto r = std::make_shared<R>(std::forward<Args>(args)...);
  R* p = r.get();
  core c{r, resource_ref<>(*p), {}, {}};
  if constexpr (has_release<R>) c.release = [p] { return p->release(); };
  else c.release = [] { return std::size_t{0}; };
  if constexpr (has_stats<R>) c.stats = [p] { return p->stats(); };
  else c.stats = [] { return vram::stats{}; };
  if constexpr (requires { p->summary(); }) {
    c.mark_step = [p] { return p->mark_step(); };
    c.plan = [p] { return p->summary(); };
  }
  return c;
}

template <class Source, class Spill>
core make_allocator(const config& cfg, Source source, Spill spill) {
  switch (cfg.allocator) {
    case allocator_kind::pool: {
      stream_pool_options pool{.initial_size = cfg.pool_initial, .maximum_size = cfg.pool_max, .growth_step = cfg.pool_step};
      if (cfg.plan) return make_core<planned_pool<Source>>(std::move(source), planned_pool_options{.online = pool});
      return make_core<stream_pool<Source>>(std::move(source), pool);
    }
    case allocator_kind::slab:
      return make_core<budget_slab<Source, Spill>>(std::move(source), std::move(spill),
                                                   budget_slab_options{.device_budget = cfg.device_budget});
    case allocator_kind::direct: return make_core<Source>(std::move(source));
  }
  detail::throw_invalid_argument("vram_c", "unknown allocator");
}

/// `name` with its first "%d" replaced by the device id.
std::string for_device(std::string name, int device) {
  if (std::size_t at = name.find("%d"); at != std::string::npos) name.replace(at, 2, std::to_string(device));
  return name;
}

/// The device's ledger (VRAM_LEDGER with "%d" replaced by the device id), attached to
/// charge; none when VRAM_LEDGER is unset.
ledger_tenant attach_ledger(const config& cfg, int device) {
  if (cfg.ledger.empty()) return {};
  auto ledger = quota_ledger::attach(for_device(cfg.ledger, device), ledger_access::charge);
  return {ledger, ledger->at(cfg.ledger_tenant)};
}

/// The allocator over `source`, charged to `ledger` when there is one: the ledger then counts
/// what the process holds from the device, cached free bytes included.
template <class Source, class Spill>
core make_charged_allocator(const config& cfg, const ledger_tenant& ledger, Source source, Spill spill) {
  if (!ledger.ledger) return make_allocator(cfg, std::move(source), std::move(spill));
  return make_allocator(cfg, ledger_quota_adaptor<Source>(std::move(source), ledger), std::move(spill));
}

std::size_t host_memory_bytes() noexcept {
  long pages = sysconf(_SC_PHYS_PAGES);
  long page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<std::size_t>(pages) * static_cast<std::size_t>(page) : 0;
}

using stack = tracker_adaptor<quota_adaptor<resource_ref<>>>;

struct device_state {
  device_state(int id, const config& c, ledger_tenant l, core k, std::size_t cap)
      : device(id), cfg(c), ledger(std::move(l)), base(std::move(k)), capacity(cap),
        top(quota_adaptor<resource_ref<>>(base.ref),
            tracker_options{.device = id, .event_log = cfg.event_log.empty() ? "" : for_device(cfg.event_log, id)}) {
    if (!cfg.tenant_name.empty() || cfg.tenant_quota != 0) {
      configured_tenant = tenant_named(cfg.tenant_name);
      if (cfg.tenant_quota != 0) top.upstream().set_hard_limit(configured_tenant, cfg.tenant_quota);
    }
  }

  int device;
  config cfg;
  ledger_tenant ledger;  // no ledger when VRAM_LEDGER is unset
  core base;
  std::size_t capacity;  // bytes of the device (for the memory fraction)
  stack top;
  tenant configured_tenant{};

  std::atomic<std::size_t> limit{0};  // memory-fraction cap on live.charged(); 0: none
  std::atomic<std::size_t> ooms{0};
  std::atomic<std::size_t> misuses{0};

  void report(misuse kind, void* p, std::size_t bytes, std::size_t expected) noexcept {
    misuses.fetch_add(1, std::memory_order_relaxed);
    report_misuse({kind, "vram_c", p, bytes, expected});
  }

  live_pointers live;  // every live pointer of the C ABI on this device, and the bytes charged

  [[nodiscard]] stream_ref stream_of(vram_stream_t s) const noexcept {
    if (cfg.backend != backend_kind::cuda) return stream_ref{};  // host backends ignore streams
    return s != nullptr ? stream_ref(s) : stream_ref::cuda_default();
  }

  [[nodiscard]] const char* describe() const noexcept {
    static constexpr const char* names[3][3] = {{"host/pool", "host/slab", "host/direct"},
                                                {"simulated/pool", "simulated/slab", "simulated/direct"},
                                                {"cuda/pool", "cuda/slab", "cuda/direct"}};
    static constexpr const char* planned[3] = {"host/pool+plan", "simulated/pool+plan", "cuda/pool+plan"};
    if (cfg.plan) return planned[static_cast<int>(cfg.backend)];
    return names[static_cast<int>(cfg.backend)][static_cast<int>(cfg.allocator)];
  }

};

std::mutex init_mutex;
std::array<std::atomic<device_state*>, max_devices> devices{};

device_state* create_device(int device) {
  config cfg = read_config();
#if VRAM_HAS_CUDA
  if (cfg.backend == backend_kind::cuda) {
    int count = 0;
    detail::check_cuda(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
    if (device >= count) detail::throw_invalid_argument("vram_c", "device id beyond the CUDA device count");
    detail::cuda_device_guard guard(device);
    std::size_t free_bytes = 0, total = 0;
    detail::check_cuda(cudaMemGetInfo(&free_bytes, &total), "cudaMemGetInfo");
    ledger_tenant ledger = attach_ledger(cfg, device);
    core k = make_charged_allocator(cfg, ledger, cuda_device_source(device), cuda_pinned_source{});
    return new device_state(device, cfg, std::move(ledger), std::move(k), total);
  }
#endif
  if (device >= cfg.device_count) detail::throw_invalid_argument("vram_c", "device id beyond VRAM_DEVICE_COUNT");
  if (cfg.backend == backend_kind::simulated) {
    std::size_t capacity = cfg.device_budget != 0 && cfg.allocator != allocator_kind::slab
                               ? cfg.device_budget
                               : std::size_t{80} << 30;
    simulated_device_source src(simulated_device_options{.capacity = capacity});
    ledger_tenant ledger = attach_ledger(cfg, device);
    core k = make_charged_allocator(cfg, ledger, src, host_source{});
    return new device_state(device, cfg, std::move(ledger), std::move(k), capacity);
  }
  std::size_t capacity = cfg.device_budget != 0 ? cfg.device_budget : host_memory_bytes();
  ledger_tenant ledger = attach_ledger(cfg, device);
  core k = make_charged_allocator(cfg, ledger, host_source{}, host_source{});
  return new device_state(device, cfg, std::move(ledger), std::move(k), capacity);
}

/// At exit: writes every device's event log buffer (VRAM_EVENT_LOG) to its file, unless a
/// thread still inside that device's tracker holds it (then that buffer is lost rather than
/// the exit hanging on a thread that may never return).
void flush_event_logs() noexcept {
  for (auto& slot : devices)
    if (device_state* d = slot.load(std::memory_order_acquire)) {
      try {
        (void)d->top.try_flush_event_log();
      } catch (...) {
      }
    }
}

/// The device's state, created on first use. Throws (caught by the entry points).
device_state& state_of(int device) {
  if (device < 0 || device >= max_devices) detail::throw_invalid_argument("vram_c", "device id out of range");
  device_state* s = devices[static_cast<std::size_t>(device)].load(std::memory_order_acquire);
  if (s != nullptr) [[likely]] return *s;
  std::lock_guard lock(init_mutex);
  s = devices[static_cast<std::size_t>(device)].load(std::memory_order_relaxed);
  if (s == nullptr) {
    s = create_device(device);
    devices[static_cast<std::size_t>(device)].store(s, std::memory_order_release);
    // Devices live until vram_shutdown, which a framework may never call: the event logs'
    // buffers are written out at exit.
    static bool flush_at_exit = std::atexit(flush_event_logs) == 0;
    (void)flush_at_exit;
  }
  return *s;
}

device_state* existing(int device) noexcept {
  if (device < 0 || device >= max_devices) return nullptr;
  return devices[static_cast<std::size_t>(device)].load(std::memory_order_acquire);
}

/// Runs `f` with the device current (cuda backend), so growth lands on the right device.
template <class F>
auto on_device(device_state& d, F&& f) {
#if VRAM_HAS_CUDA
  if (d.cfg.backend == backend_kind::cuda) {
    detail::cuda_device_guard guard(d.device);
    return f();
  }
#endif
  return f();
}

}  // namespace
