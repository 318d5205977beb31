// vram's C ABI (include/vram/vram_c.h): the extern "C" entry points of libvram_c.so, over its
// rooms: environment.hpp (the VRAM_* variables), backends.hpp (the stack per device) and
// exports.hpp (allocate, free, errors).
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
#include <cstring>
#include <mutex>
#include <string>

#include "backends.hpp"
#include "environment.hpp"
#include "exports.hpp"

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
    switch (d->live.add_stream(ptr, stream)) {
      case live_pointers::added::foreign: continue;
      case live_pointers::added::no_memory: fail("vram: out of memory in vram_record_stream"); return;
      case live_pointers::added::yes: return;
    }
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
    out->plans_declined = s.plans_declined;
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
    if (!d->live.empty()) {  // leaked on purpose: the owners of the live allocations may still use them
      report_misuse({misuse::live_at_destruction, "vram_c", nullptr, d->live.charged(), 0});
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
