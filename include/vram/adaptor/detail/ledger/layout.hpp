#pragma once
// The bytes of a quota ledger: two files in one directory, mapped by every process that
// takes part.
//
//   limits   the tenant tree and each tenant's hard and soft limit. Written by operators
//            only; tenant processes map it read-only when its mode says so, so the kernel,
//            not vram, keeps a tenant from raising its own limit.
//   usage    what is charged: per tenant (including descendants) and per process slot (its
//            own tenants only), behind one process-shared robust mutex. Every tenant process
//            writes it.
//
// Both begin with the same identity (magic, layout version, sizes, a random ledger id and a
// checksum), so a file of another ledger, of another layout or of nothing is refused at attach.
// Nothing read from either file is used as an index before it is checked.
//
// The invariant, whenever the charge mutex is free:
//   usage[t] == sum over claimed slots s, over tenants u in t's subtree, of charged[s][u]
// It is what lets a dead process be reclaimed exactly (subtract its slot) and a holder that
// died inside the mutex be repaired (recompute every usage from the slots).

#include <pthread.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace vram::detail::ledger {

inline constexpr std::uint32_t layout_version = 1;
inline constexpr std::uint32_t max_tenants = 256;
inline constexpr std::uint32_t max_processes = 128;
inline constexpr std::size_t name_bytes = 48;  // a tenant's own name, NUL included
inline constexpr std::uint32_t no_parent = ~std::uint32_t{0};

inline constexpr char limits_magic[8] = {'v', 'r', 'a', 'm', 'L', 'I', 'M', 'T'};
inline constexpr char usage_magic[8] = {'v', 'r', 'a', 'm', 'U', 'S', 'E', 'D'};

static_assert(std::atomic<std::uint64_t>::is_always_lock_free && std::atomic<std::uint32_t>::is_always_lock_free,
              "the ledger's counters are shared between processes: they must be lock-free (address-free)");

/// FNV-1a, 64 bits: cheap, and enough to tell damaged bytes from intact ones (not an
/// authenticator: whoever may write the files is trusted with them).
inline std::uint64_t fnv1a(const void* data, std::size_t n, std::uint64_t h = 0xcbf29ce484222325ull) noexcept {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

/// The first bytes of both files. Written once at creation, never changed.
struct identity {
  char magic[8];
  std::uint32_t version;
  std::uint32_t tenants;    // max_tenants of the creator
  std::uint32_t processes;  // max_processes of the creator
  std::uint32_t mutex_bytes;  // sizeof(pthread_mutex_t) of the creator: the mutexes' ABI
  std::uint64_t file_bytes;
  std::uint64_t ledger_id[2];  // random, the same in both files
  std::uint64_t checksum;      // fnv1a of everything above

  [[nodiscard]] std::uint64_t expected_checksum() const noexcept { return fnv1a(this, offsetof(identity, checksum)); }
};

/// A tenant. Its name and parent are written before the tenant count is raised past it
/// (release) and never change; `check` seals them so a damaged entry is refused.
struct tenant_entry {
  char name[name_bytes];
  std::uint32_t parent;  // no_parent, or an index below this entry's
  std::uint32_t check;   // low 32 bits of fnv1a(name, parent, index)
  std::atomic<std::uint64_t> hard;  // bytes; ~0: none
  std::atomic<std::uint64_t> soft;

  [[nodiscard]] static std::uint32_t seal(const char* name, std::uint32_t parent, std::uint32_t index) noexcept {
    std::uint64_t h = fnv1a(name, name_bytes);
    h = fnv1a(&parent, sizeof parent, h);
    return static_cast<std::uint32_t>(fnv1a(&index, sizeof index, h));
  }
};

struct limits_file {
  identity id;
  std::atomic<std::uint32_t> tenant_count;  // entries [0, tenant_count) are published
  std::uint32_t padding;
  pthread_mutex_t admin_mutex;  // serializes tenant creation (robust, process-shared)
  tenant_entry tenants[max_tenants];
};

/// Usage of one tenant and its descendants, over every process.
struct alignas(32) tenant_usage {
  std::atomic<std::uint64_t> usage;
  std::atomic<std::uint64_t> peak;
  std::atomic<std::uint64_t> refusals;
};

/// One attached process (an attach, precisely: a process may hold several). Claimed under
/// the charge mutex. Its holder keeps an open-file-description lock on byte `index` of the
/// usage file for as long as it lives: the kernel drops that lock when the process dies,
/// however it dies, so "claimed and unlocked" means dead, across pid reuse and pid namespaces.
struct process_slot {
  std::atomic<std::uint32_t> claimed;  // 0 free, 1 claimed
  std::int32_t pid;                    // as the process saw itself (for people; liveness is the lock)
  char command[16];                    // its /proc comm, for people
  std::atomic<std::uint64_t> charged[max_tenants];  // its own charges, per tenant (not ancestors)
};

struct usage_file {
  identity id;
  pthread_mutex_t charge_mutex;  // every change to usage below (robust, process-shared)
  std::atomic<std::uint64_t> reclaimed;  // dead processes whose charges were returned
  std::atomic<std::uint64_t> repairs;    // times a holder died inside charge_mutex
  tenant_usage tenants[max_tenants];
  process_slot processes[max_processes];
};

static_assert(std::is_standard_layout_v<limits_file> && std::is_standard_layout_v<usage_file>);

}  // namespace vram::detail::ledger
