#pragma once
// The C ABI's exports, behind the extern "C" entry points: the per-thread last error,
// allocate and free with their out-of-memory messages, the guard that keeps exceptions from
// crossing the boundary, and per-device snapshot paths. A room of vram_c_abi.cpp, included
// by it alone.

#include <cstdio>
#include <exception>
#include <mutex>
#include <new>
#include <string>

#include <vram/vram_c.h>
#include <vram/core/event.hpp>

#include "backends.hpp"

namespace {

using namespace vram;

// ---- errors -----------------------------------------------------------------------------

thread_local std::string last_error;

void fail(const char* what) noexcept {
  try {
    last_error = what;
  } catch (...) {  // no memory for the message either: keep the previous one
  }
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
  // Under a memory fraction the request is charged first, so that one over the cap changes
  // nothing. Without one it is charged when recorded, in the same section (an allocation
  // that meets a cap set meanwhile counts as made before it).
  const std::size_t cap = d.limit.load(std::memory_order_relaxed);
  if (cap != 0 && !d.live.charge(size, cap)) {
    d.ooms.fetch_add(1, std::memory_order_relaxed);
    char why[200];
    std::snprintf(why, sizeof why,
                  "vram: out of memory: %zu bytes requested, over the memory fraction set with "
                  "vram_set_memory_fraction (a cap of %zu bytes, %zu charged)",
                  size, cap, d.live.charged());
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
    d.live.insert(p, size, cap != 0);
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
  if (cap != 0) d.live.uncharge(size);
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
  switch (d.live.take(p, size, entry)) {  // uncharged with it
    case live_pointers::found::yes: break;
    case live_pointers::found::foreign: d.report(misuse::foreign_pointer, p, size, 0); return;
    case live_pointers::found::wrong_size: d.report(misuse::wrong_size, p, size, entry.size); return;
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
    // could let it be reused under their work. It stays held instead (charged again, and
    // tracked): reported, never reused.
    d.live.charge(entry.size, 0);
    d.report(misuse::upstream_failure, p, entry.size, 0);
  }
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
