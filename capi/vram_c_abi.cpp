// vram's C ABI (include/vram/vram_c.h): the one source file of libvram_c.so.
//
// Per device, a stack built from the environment on first use:
//
//   tracker_adaptor            who holds what (vram_snapshot; every event to VRAM_EVENT_LOG)
//     quota_adaptor            tenant quotas (VRAM_TENANT, VRAM_TENANT_QUOTA, vram_set_tenant_quota)
//       resource_ref<>         -> the allocator (stream_pool | budget_slab | the source itself)
//                                   over the source (cuda_device_source | simulated | host),
//                                   charged to a quota ledger when VRAM_LEDGER names one
//                                   (ledger_quota_adaptor between the allocator and the source)
//
// plus, beside the stack, a table of live pointers (size, extra streams) that serves CuPy's
// size-less free, record_stream, and the memory-fraction cap. No exception crosses the C
// boundary: every entry point catches, records the message for vram_last_error() and returns
// NULL / -1.

#define VRAM_C_BUILDING 1
#include <vram/vram_c.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <unistd.h>

#include <vram/adaptor/ledger_quota_adaptor.hpp>
#include <vram/adaptor/quota_adaptor.hpp>
#include <vram/core/error.hpp>
#include <vram/adaptor/tracker_adaptor.hpp>
#include <vram/core/bytes.hpp>
#include <vram/core/parse.hpp>
#include <vram/alloc/budget_slab.hpp>
#include <vram/alloc/planned_pool.hpp>
#include <vram/alloc/stream_pool.hpp>
#include <vram/core/event.hpp>
#include <vram/core/resource_ref.hpp>
#include <vram/core/tenant.hpp>
#include <vram/source/host_source.hpp>
#include <vram/source/simulated_device_source.hpp>
#if VRAM_HAS_CUDA
#  include <vram/detail/cuda_device_guard.hpp>
#  include <vram/source/cuda_device_source.hpp>
#  include <vram/source/cuda_pinned_source.hpp>
#endif

namespace {

using namespace vram;

constexpr int max_devices = 64;

// ---- errors -----------------------------------------------------------------------------

thread_local std::string last_error;

void fail(const char* what) noexcept {
  try {
    last_error = what;
  } catch (...) {  // no memory for the message either: keep the previous one
  }
}

// ---- configuration ------------------------------------------------------------------------

enum class backend_kind { host, simulated, cuda };
enum class allocator_kind { pool, slab, direct };

struct config {
  backend_kind backend = backend_kind::host;
  allocator_kind allocator = allocator_kind::pool;
  bool plan = false;              // VRAM_PLAN=1: the pool is a planned_pool, driven by vram_mark_step
  std::size_t pool_initial = 0;
  std::size_t pool_max = 0;
  std::size_t pool_step = 0;
  std::size_t device_budget = 0;  // slab budget; simulated capacity
  std::string tenant_name;        // empty: the default tenant
  std::size_t tenant_quota = 0;   // 0: none
  std::string ledger;             // quota ledger name ("%d": the device id); empty: none
  std::string ledger_tenant;      // the tenant path this process charges in it
  std::string event_log;          // the tracker's event log ("%d": the device id); empty: none
  int device_count = 8;           // host / simulated
  // The caps as the environment gave them, for the out-of-memory they cause; empty: unset.
  std::string pool_max_text, device_budget_text, tenant_quota_text;
};

/// The value of `name`; null when it is unset. Set and empty is a value (refused where a
/// number or a choice is meant).
const char* env(const char* name) noexcept { return std::getenv(name); }

/// A name, a path or a file: empty is the same as unset.
const char* env_name(const char* name) noexcept {
  const char* v = env(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

[[noreturn]] void refuse(const char* name, const char* text, const char* expected) {
  detail::throw_invalid_argument("vram_c", refusal(name, text, expected).c_str());
}

/// A size (vram::parse_bytes), kept in `bytes` and as given in `text`; unchanged when unset.
void env_size(const char* name, std::size_t& bytes, std::string* text = nullptr) {
  const char* v = env(name);
  if (v == nullptr) return;
  std::optional<std::size_t> b = parse_bytes(v);
  if (!b) refuse(name, v, size_grammar);
  bytes = *b;
  if (text != nullptr) *text = v;
}

/// The index of the value of `name` among `choices`; -1 when it is unset.
template <std::size_t N>
int env_choice(const char* name, const std::array<const char*, N>& choices, const char* expected) {
  const char* v = env(name);
  if (v == nullptr) return -1;
  for (std::size_t i = 0; i < N; ++i)
    if (std::strcmp(v, choices[i]) == 0) return static_cast<int>(i);
  refuse(name, v, expected);
}

bool cuda_usable() noexcept {
#if VRAM_HAS_CUDA
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return count > 0;
#else
  return false;
#endif
}

config read_config() {
  config c;
  c.backend = cuda_usable() ? backend_kind::cuda : backend_kind::host;
  switch (env_choice("VRAM_BACKEND", std::array{"host", "simulated", "cuda"}, "cuda, simulated or host")) {
    case 0: c.backend = backend_kind::host; break;
    case 1: c.backend = backend_kind::simulated; break;
    case 2:
      if (!cuda_usable()) detail::throw_invalid_argument("vram_c", "VRAM_BACKEND=cuda but no usable CUDA device");
      c.backend = backend_kind::cuda;
      break;
    default: break;
  }
  switch (env_choice("VRAM_ALLOCATOR", std::array{"pool", "slab", "direct"}, "pool, slab or direct")) {
    case 0: c.allocator = allocator_kind::pool; break;
    case 1: c.allocator = allocator_kind::slab; break;
    case 2: c.allocator = allocator_kind::direct; break;
    default: break;
  }
  env_size("VRAM_POOL_INITIAL", c.pool_initial);
  env_size("VRAM_POOL_MAX", c.pool_max, &c.pool_max_text);
  env_size("VRAM_POOL_STEP", c.pool_step);
  env_size("VRAM_DEVICE_BUDGET", c.device_budget, &c.device_budget_text);
  if (const char* v = env_name("VRAM_TENANT")) c.tenant_name = v;
  env_size("VRAM_TENANT_QUOTA", c.tenant_quota, &c.tenant_quota_text);
  if (const char* v = env("VRAM_DEVICE_COUNT")) {
    std::optional<std::uint64_t> n = parse_count(v);
    if (!n || *n < 1 || *n > max_devices) refuse("VRAM_DEVICE_COUNT", v, "a whole decimal number of devices, 1 to 64");
    c.device_count = static_cast<int>(*n);
  }
  if (const char* v = env_name("VRAM_EVENT_LOG")) c.event_log = v;
  if (const char* v = env_name("VRAM_LEDGER")) c.ledger = v;
  if (const char* v = env_name("VRAM_LEDGER_TENANT")) c.ledger_tenant = v;
  if (c.ledger.empty() != c.ledger_tenant.empty())
    detail::throw_invalid_argument("vram_c", "VRAM_LEDGER and VRAM_LEDGER_TENANT go together");
  c.plan = env_choice("VRAM_PLAN", std::array{"0", "1"}, "0 or 1") == 1;
  if (c.plan && c.allocator != allocator_kind::pool)
    detail::throw_invalid_argument("vram_c", "VRAM_PLAN=1 plans the pool: it needs VRAM_ALLOCATOR=pool");
  if (c.allocator == allocator_kind::slab && c.device_budget == 0)
    detail::throw_invalid_argument("vram_c", "VRAM_ALLOCATOR=slab needs VRAM_DEVICE_BUDGET");
  return c;
}

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

struct live_entry {
  std::size_t size;
  std::vector<vram_stream_t> streams;  // record_stream: extra streams to wait for at free
};

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

  std::atomic<std::size_t> limit{0};    // memory-fraction cap on charged bytes; 0: none
  std::atomic<std::size_t> charged{0};  // bytes of live allocations (as requested)
  std::atomic<std::size_t> ooms{0};
  std::atomic<std::size_t> misuses{0};

  void report(misuse kind, void* p, std::size_t bytes, std::size_t expected) noexcept {
    misuses.fetch_add(1, std::memory_order_relaxed);
    report_misuse({kind, "vram_c", p, bytes, expected});
  }

  std::mutex live_mutex;
  std::unordered_map<void*, live_entry> live;

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

  bool charge(std::size_t bytes) noexcept {
    std::size_t cap = limit.load(std::memory_order_relaxed);
    std::size_t now = charged.load(std::memory_order_relaxed);
    do {
      if (cap != 0 && (now > cap || bytes > cap - now)) return false;
    } while (!charged.compare_exchange_weak(now, now + bytes, std::memory_order_relaxed));
    return true;
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

/// `message`, and where a ledger refused the allocator's growth, which of its tenants did.
std::string with_ledger(const device_state& d, const char* message, std::size_t size) {
  std::string m = message;
  if (!d.ledger.ledger) return m;
  const quota_ledger& l = *d.ledger.ledger;
  for (tenant t = d.ledger.t;;) {
    std::size_t usage = l.usage(t), hard = l.hard_limit(t);
    if (hard != quota_ledger::unlimited && usage + size > hard) {
      m += "\nquota ledger " + l.path() + ": tenant '" + l.path_of(t) + "' holds " + std::to_string(usage) +
           " of its " + std::to_string(hard) + " byte hard limit";
      return m;
    }
    if (!l.parent(t, t)) return m;
  }
}

/// The variable that set the cap which refused `oom`, as the environment gave it: a line for
/// its explanation; empty when no variable set what refused.
std::string configured_cap(const device_state& d, const out_of_memory& oom) {
  const config& c = d.cfg;
  switch (oom.cause()) {
    case out_of_memory::reason::capped:
      if (!c.pool_max_text.empty()) return "\nthe pool's cap is VRAM_POOL_MAX=" + c.pool_max_text;
      break;
    case out_of_memory::reason::quota: {
      const auto* q = dynamic_cast<const quota_exceeded*>(&oom);
      if (q != nullptr && !c.tenant_quota_text.empty() && q->limited_tenant() == d.configured_tenant &&
          q->limit() == c.tenant_quota)
        return "\nthe tenant's hard limit is VRAM_TENANT_QUOTA=" + c.tenant_quota_text;
      break;
    }
    case out_of_memory::reason::budgets:
      if (!c.device_budget_text.empty()) return "\nthe device budget is VRAM_DEVICE_BUDGET=" + c.device_budget_text;
      break;
    default:
      if (c.backend == backend_kind::simulated && c.allocator != allocator_kind::slab && !c.device_budget_text.empty())
        return "\nthe simulated device's capacity is VRAM_DEVICE_BUDGET=" + c.device_budget_text;
      break;
  }
  return {};
}

void* allocate(int device, std::size_t size, vram_stream_t stream) noexcept {
  if (size == 0) return nullptr;
  device_state* dp = nullptr;
  try {
    dp = &state_of(device);
  } catch (const std::exception& e) {
    fail(e.what());
    return nullptr;
  } catch (...) {
    fail("vram: unknown error");
    return nullptr;
  }
  device_state& d = *dp;
  if (!d.charge(size)) {
    d.ooms.fetch_add(1, std::memory_order_relaxed);
    char why[200];
    std::snprintf(why, sizeof why,
                  "vram: out of memory: %zu bytes requested, over the memory fraction set with "
                  "vram_set_memory_fraction (a cap of %zu bytes, %zu charged)",
                  size, d.limit.load(std::memory_order_relaxed), d.charged.load(std::memory_order_relaxed));
    fail(why);
    return nullptr;
  }
  tenant_scope scope(thread_tenant_set ? thread_tenant : d.configured_tenant);
  stream_ref s = d.stream_of(stream);
  void* p = nullptr;
  try {
    p = on_device(d, [&] {
      try {
        return d.top.allocate(s, size, default_alignment);
      } catch (const quota_exceeded&) {
        throw;  // releasing caches cannot raise a quota
      } catch (const std::bad_alloc&) {
        d.base.release();  // give cached blocks back to the driver and try once more
        return d.top.allocate(s, size, default_alignment);
      }
    });
    std::lock_guard lock(d.live_mutex);
    d.live.emplace(p, live_entry{size, {}});
    return p;
  } catch (const std::bad_alloc& e) {
    d.ooms.fetch_add(1, std::memory_order_relaxed);
    try {  // vram's errors explain themselves: the cause, what would have served the request,
           // and who held the memory (the stack's tracker attached that on the way up)
      const auto* oom = dynamic_cast<const out_of_memory*>(&e);
      std::string why = with_ledger(d, oom != nullptr ? oom->explain().c_str() : e.what(), size);
      if (oom != nullptr) why += configured_cap(d, *oom);
      fail(why.c_str());
    } catch (...) {
      fail(e.what());
    }
  } catch (const std::exception& e) {
    fail(e.what());
  } catch (...) {
    fail("vram: unknown error");
  }
  if (p != nullptr) d.top.deallocate(s, p, size, default_alignment);  // the table insert failed
  d.charged.fetch_sub(size, std::memory_order_relaxed);
  return nullptr;
}

/// Frees `p`; `size` 0 means "look it up" (CuPy). Unknown pointers are reported, not freed.
void deallocate(int device, void* p, std::size_t size, vram_stream_t stream) noexcept {
  if (p == nullptr) return;
  device_state* dp = existing(device);
  if (dp == nullptr) {
    report_misuse({misuse::foreign_pointer, "vram_c", p, size, 0});
    return;
  }
  device_state& d = *dp;
  live_entry entry;
  {
    std::lock_guard lock(d.live_mutex);
    auto it = d.live.find(p);
    if (it == d.live.end()) {
      d.report(misuse::foreign_pointer, p, size, 0);
      return;
    }
    if (size != 0 && size != it->second.size) {
      d.report(misuse::wrong_size, p, size, it->second.size);
      return;
    }
    entry = std::move(it->second);
    d.live.erase(it);
  }
  // Nothing here blocks the caller: the free is ordered on `s` (a null stream, as CuPy's free
  // passes, is the legacy default stream), the record_stream streams through events, and the
  // tracker records its completion with an event it polls later. The allocators' own
  // contracts still hold: VRAM_ALLOCATOR=direct (cudaFree synchronizes the device anyway) and
  // slab synchronize `s` in their deallocate, as their class comments state; pool does not.
  stream_ref s = d.stream_of(stream);
  try {
    on_device(d, [&] {
      // record_stream: the free is ordered after the work enqueued so far on every stream
      // that used the block (cudaStreamWaitEvent; the caller is not blocked).
      for (vram_stream_t other : entry.streams) {
        stream_ref o = d.stream_of(other);
        if (o == s) continue;
        event e;
        e.record(o);
        e.make_wait(s);
      }
      d.top.deallocate(s, p, entry.size, default_alignment);
      return 0;
    });
  } catch (...) {
    // An event call failed, so the free cannot be ordered after the other streams' work.
    // Waiting for them would block the caller on a broken device; handing the block back
    // could let it be reused under their work. It stays held instead (still charged and
    // tracked): reported, never reused.
    d.report(misuse::upstream_failure, p, entry.size, 0);
    return;
  }
  d.charged.fetch_sub(entry.size, std::memory_order_relaxed);
}

template <class F>
int guarded(F&& f) noexcept {
  try {
    return f();
  } catch (const std::exception& e) {
    fail(e.what());
  } catch (...) {
    fail("vram: unknown error");
  }
  return -1;
}

std::string device_path(const char* path, int device) {
  std::string p(path);
  if (device == 0) return p;
  std::size_t slash = p.find_last_of('/');
  std::size_t dot = p.find_last_of('.');
  std::string suffix = ".dev" + std::to_string(device);
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) return p + suffix;
  return p.substr(0, dot) + suffix + p.substr(dot);
}

}  // namespace

extern "C" {

VRAM_C_API void* vram_malloc(size_t size, int device, vram_stream_t stream) { return allocate(device, size, stream); }

VRAM_C_API void vram_free(void* ptr, size_t size, int device, vram_stream_t stream) {
  deallocate(device, ptr, size, stream);
}

VRAM_C_API int vram_init(int device) {
  return guarded([&] {
    (void)state_of(device);
    return 0;
  });
}

VRAM_C_API void vram_empty_cache(void) {
  for (int i = 0; i < max_devices; ++i) {
    if (device_state* d = existing(i)) {
      (void)guarded([&] {
        on_device(*d, [&] { return d->base.release(); });
        return 0;
      });
    }
  }
}

VRAM_C_API int vram_set_memory_fraction(double fraction, int device) {
  return guarded([&] {
    if (!(fraction > 0.0 && fraction <= 1.0)) detail::throw_invalid_argument("vram_c", "fraction must be in (0, 1]");
    device_state& d = state_of(device);
    if (d.capacity == 0) detail::throw_invalid_argument("vram_c", "device capacity unknown");
    auto cap = static_cast<std::size_t>(fraction * static_cast<double>(d.capacity));
    d.limit.store(fraction == 1.0 ? 0 : std::max<std::size_t>(cap, 1), std::memory_order_relaxed);
    return 0;
  });
}

VRAM_C_API void vram_record_stream(void* ptr, vram_stream_t stream) {
  if (ptr == nullptr) return;
  for (int i = 0; i < max_devices; ++i) {
    device_state* d = existing(i);
    if (d == nullptr) continue;
    std::lock_guard lock(d->live_mutex);
    auto it = d->live.find(ptr);
    if (it == d->live.end()) continue;
    auto& streams = it->second.streams;
    try {
      if (std::find(streams.begin(), streams.end(), stream) == streams.end()) streams.push_back(stream);
    } catch (...) {
      fail("vram: out of memory in vram_record_stream");
    }
    return;
  }
  report_misuse({misuse::foreign_pointer, "vram_c", ptr, 0, 0});
}

VRAM_C_API void* vram_cupy_malloc(void* /*param*/, size_t size, int device) {
  return allocate(device, size, nullptr);
}

// CuPy passes no stream: the free is ordered on the legacy default stream (where CuPy's
// default stream work runs; it also follows the work of blocking streams). Stream-ordered
// like any other free: the caller is not blocked.
VRAM_C_API void vram_cupy_free(void* /*param*/, void* ptr, int device) { deallocate(device, ptr, 0, nullptr); }

VRAM_C_API int vram_stats(int device, vram_stats_t* out) {
  return guarded([&] {
    if (out == nullptr) detail::throw_invalid_argument("vram_c", "vram_stats: out is NULL");
    device_state* d = existing(device);
    if (d == nullptr) detail::throw_invalid_argument("vram_c", "vram_stats: device has no allocator yet");
    vram::stats s = d->base.stats();
    vram::stats t = d->top.stats();  // live allocations and counts as the tracker saw them
    *out = vram_stats_t{};
    out->live_bytes = s.live_bytes != 0 || s.reserved_bytes != 0 ? s.live_bytes : t.live_bytes;
    out->peak_live_bytes = std::max(s.peak_live_bytes, out->live_bytes);
    out->reserved_bytes = s.reserved_bytes;
    out->peak_reserved_bytes = s.peak_reserved_bytes;
    out->live_allocations = t.live_allocations;
    out->total_allocations = std::max(s.total_allocations, t.total_allocations);
    out->total_deallocations = std::max(s.total_deallocations, t.total_deallocations);
    out->free_bytes = s.free_bytes;
    out->largest_free_block = s.largest_free_block;
    out->upstream_allocations = s.upstream_allocations;
    out->ooms = d->ooms.load(std::memory_order_relaxed);
    out->spills = s.spills;
    out->spilled_bytes = s.spilled_bytes;
    out->limit_bytes = d->limit.load(std::memory_order_relaxed);
    out->misuses = d->misuses.load(std::memory_order_relaxed);
    out->fragmentation = s.fragmentation();
    return 0;
  });
}

VRAM_C_API int vram_plan_stats(int device, vram_plan_stats_t* out) {
  return guarded([&] {
    if (out == nullptr) detail::throw_invalid_argument("vram_c", "vram_plan_stats: out is NULL");
    device_state* d = existing(device);
    if (d == nullptr) detail::throw_invalid_argument("vram_c", "vram_plan_stats: device has no allocator yet");
    *out = vram_plan_stats_t{};
    if (!d->base.plan) return 0;  // not planned: enabled stays 0
    plan_summary s = d->base.plan();
    out->enabled = 1;
    out->phase = static_cast<int>(s.now);
    out->plans_made = s.plans_made;
    out->plans_refused = s.plans_refused;
    out->steps_served = s.steps_served;
    out->last_step_planned = s.last_step_planned;
    out->last_step_off_plan = s.last_step_off_plan;
    out->entries = s.entries;
    out->planned_entries = s.planned_entries;
    out->range_bytes = static_cast<size_t>(s.range_bytes);
    return 0;
  });
}

VRAM_C_API int vram_snapshot(const char* path) {
  return guarded([&] {
    if (path == nullptr || *path == '\0') detail::throw_invalid_argument("vram_c", "vram_snapshot: no path");
    int written = 0;
    for (int i = 0; i < max_devices; ++i) {
      device_state* d = existing(i);
      if (d == nullptr) continue;
      if (!d->top.dump(device_path(path, i))) detail::throw_invalid_argument("vram_c", "vram_snapshot: cannot write");
      ++written;
    }
    if (written == 0) detail::throw_invalid_argument("vram_c", "vram_snapshot: no device in use");
    return 0;
  });
}

VRAM_C_API int vram_mark_step(void) {
  return guarded([&] {
    int leaks = 0;
    for (int i = 0; i < max_devices; ++i)
      if (device_state* d = existing(i)) {
        if (d->base.mark_step) (void)d->base.mark_step();  // VRAM_PLAN=1: the step boundary drives the plan
        (void)d->top.mark_step();
        leaks += static_cast<int>(d->top.leaks().size());
      }
    return leaks;
  });
}

VRAM_C_API int vram_set_tenant(const char* name) {
  return guarded([&] {
    if (name == nullptr) {
      thread_tenant_set = false;
      return 0;
    }
    thread_tenant = tenant_named(name);
    thread_tenant_set = true;
    return 0;
  });
}

VRAM_C_API int vram_set_tenant_quota(const char* name, size_t bytes, int device) {
  return guarded([&] {
    if (name == nullptr) detail::throw_invalid_argument("vram_c", "vram_set_tenant_quota: no name");
    tenant t = tenant_named(name);
    state_of(device).top.upstream().set_hard_limit(t, bytes == 0 ? quota_adaptor<resource_ref<>>::unlimited : bytes);
    return 0;
  });
}

VRAM_C_API size_t vram_tenant_usage(const char* name, int device) {
  tenant t;
  device_state* d = existing(device);
  if (d == nullptr || !find_tenant(name, t)) return 0;
  try {
    return d->top.upstream().usage(t);
  } catch (...) {
    return 0;
  }
}

VRAM_C_API const char* vram_last_error(void) { return last_error.c_str(); }

VRAM_C_API const char* vram_describe(int device) {
  device_state* d = existing(device);
  return d != nullptr ? d->describe() : "";
}

VRAM_C_API void vram_shutdown(void) {
  std::lock_guard lock(init_mutex);
  for (auto& slot : devices) {
    device_state* d = slot.exchange(nullptr, std::memory_order_acq_rel);
    if (d == nullptr) continue;
    bool idle = false;
    {
      std::lock_guard live_lock(d->live_mutex);
      idle = d->live.empty();
    }
    if (!idle) {  // leaked on purpose: the owners of the live allocations may still use them
      report_misuse({misuse::live_at_destruction, "vram_c", nullptr, d->charged.load(), 0});
      try {
        (void)d->top.flush_event_log();  // its history so far, at least
      } catch (...) {
      }
      continue;
    }
    delete d;
  }
}

}  // extern "C"
