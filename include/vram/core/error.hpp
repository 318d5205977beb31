#pragma once
// The error types every vram resource throws. They form one small family, so they share
// this header (an exception to "one class per header": a user catching one wants all).
//
//   std::bad_alloc        <- vram::out_of_memory     (no memory: bytes, stream, resource, stats)
//                              <- vram::quota_exceeded    (a tenant's hard limit: tenant, limit, usage)
//                              <- vram::budgets_exhausted (budget_slab: device and spill budgets full)
//   std::runtime_error    <- vram::cuda_error        (a CUDA call failed: the cudaError_t)
//                         <- vram::ledger_error      (a quota ledger cannot be created, attached or used)
//   std::invalid_argument <- vram::invalid_argument  (bad alignment, absurd size, ...)
//                              <- vram::wrong_device      (a device's resource used on another device)
//
// Every one is thrown through vram/core/throw.hpp; none allocates on the out-of-memory path.
// What an out_of_memory learns on its way up (the streams that stranded memory, who held the
// memory) lives in fixed arrays inside it, so it refers to nothing that may die before it.

#include <array>
#include <cinttypes>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>
#include <string_view>

#include <vram/core/bytes.hpp>
#include <vram/core/config.hpp>
#include <vram/core/stats.hpp>
#include <vram/core/stream_ref.hpp>
#include <vram/core/tenant_id.hpp>

namespace vram {

/// One stream whose free blocks a request on another stream could not take whole.
struct stranded_stream {
  std::uintptr_t stream_key = 0;  ///< stream_ref::key(): a host_stream's address, a CUDA stream's handle
  std::size_t free_bytes = 0;     ///< its free blocks together
  std::size_t largest_block = 0;  ///< its largest free block
};

/// Free memory that other streams' queued work keeps in pieces (stream_pool): a free block
/// keyed to stream S merges with its neighbours only once S's work is seen complete, so a
/// run of address-adjacent free blocks can hold a request that none of its blocks holds.
/// Invariants: listed <= max_listed, listed <= streams; entries [0, listed) in descending
/// free_bytes; bytes == the sum of the free bytes of all `streams` (listed or not).
struct stream_stranding {
  static constexpr std::size_t max_listed = 4;
  std::array<stranded_stream, max_listed> stream{};
  std::size_t listed = 0;       ///< entries of `stream` in use
  std::size_t streams = 0;      ///< streams whose blocks lie in a run that would hold the request
  std::size_t bytes = 0;        ///< their free bytes together
  std::size_t largest_run = 0;  ///< the largest run of address-adjacent free blocks, stream keys ignored
};

/// A tenant or tag and its live bytes, the name copied (truncated, marked "...").
struct memory_holder {
  static constexpr std::size_t max_name = 63;
  std::array<char, max_name + 1> name{};  ///< a tenant's path ("job/model") or a tag ("": untagged)
  std::size_t bytes = 0;

  void set_name(std::string_view n) noexcept {
    std::size_t len = n.size() <= max_name ? n.size() : max_name;
    std::memcpy(name.data(), n.data(), len);
    if (len < n.size()) std::memcpy(name.data() + max_name - 3, "...", 3);
    name[len] = '\0';
  }
};

/// Who held the memory when it ran out, as a tracker_adaptor saw it: the tenants and tags
/// with the most live bytes. Invariants: tenants <= min(max_listed, total_tenants), tags <=
/// min(max_listed, total_tags); entries in descending bytes.
struct memory_holders {
  static constexpr std::size_t max_listed = 5;
  std::array<memory_holder, max_listed> tenant{};
  std::array<memory_holder, max_listed> tag{};
  std::size_t tenants = 0, tags = 0;              ///< entries in use
  std::size_t total_tenants = 0, total_tags = 0;  ///< holders there were (listed or not)
};

/// Thrown when a resource cannot provide the requested bytes. Constructing it and calling
/// what() allocate nothing: the message is formatted into a fixed buffer.
class out_of_memory : public std::bad_alloc {
 public:
  /// `resource` must be a string with static storage duration (a literal). `limit`, when not 0,
  /// is the cap the resource was configured with (a pool's maximum_size), named by `limit_name`
  /// (a literal), so the message says which cap refused. `stranded`: the free memory other
  /// streams kept in pieces, where the resource keys free blocks to streams.
  out_of_memory(const char* resource, std::size_t bytes, stream_ref stream, const vram::stats& snapshot = {},
                std::size_t limit = 0, const char* limit_name = "limit", const stream_stranding& stranded = {}) noexcept
      : resource_(resource),
        bytes_(bytes),
        stream_(stream),
        stats_(snapshot),
        limit_(limit),
        limit_name_(limit_name),
        stranded_(stranded) {
    if (limit != 0)
      std::snprintf(message_, sizeof message_,
                    "vram: out of memory in %s: %zu bytes requested (%zu live, %zu reserved; its %s is %zu bytes)",
                    resource, bytes, snapshot.live_bytes, snapshot.reserved_bytes, limit_name, limit);
    else
      std::snprintf(message_, sizeof message_,
                    "vram: out of memory in %s: %zu bytes requested (%zu live, %zu reserved)", resource, bytes,
                    snapshot.live_bytes, snapshot.reserved_bytes);
  }

  [[nodiscard]] const char* what() const noexcept override { return message_; }
  [[nodiscard]] const char* resource() const noexcept { return resource_; }
  [[nodiscard]] std::size_t bytes() const noexcept { return bytes_; }
  [[nodiscard]] stream_ref stream() const noexcept { return stream_; }
  /// The failing resource's statistics at the time of the failure (zeros where it has none).
  [[nodiscard]] const vram::stats& stats() const noexcept { return stats_; }
  /// The configured cap that refused (0: none; the upstream ran out).
  [[nodiscard]] std::size_t limit() const noexcept { return limit_; }
  /// The free memory other streams' queued work kept in pieces (streams == 0: none).
  [[nodiscard]] const stream_stranding& stranded() const noexcept { return stranded_; }

  /// Who held the memory (tenants == 0: nobody said). A tracker_adaptor attaches them to the
  /// exception as it passes (caught by reference and rethrown, so its type is kept).
  [[nodiscard]] const memory_holders& holders() const noexcept { return holders_; }
  void attach_holders(const memory_holders& h) noexcept { holders_ = h; }

  /// What ran out, read off the numbers the resource gave.
  enum class reason : std::uint8_t {
    exhausted,   ///< no free memory inside the resource would hold the request, and its upstream had none
    fragmented,  ///< its free bytes would hold the request, but no free block is large enough
    capped,      ///< its configured cap (limit()) left less room than the request
    quota,       ///< a tenant's hard limit (quota_exceeded)
    budgets,     ///< budget_slab's device and spill budgets (budgets_exhausted)
    stranded,    ///< adjacent free blocks would hold it merged, but some are keyed to streams with queued work
  };
  /// Stranding comes first: waiting for a stream is the cheapest remedy, and a capped or
  /// fragmented pool whose stranded blocks would merge needs neither more room nor fewer holes.
  [[nodiscard]] virtual reason cause() const noexcept {
    if (stranded_.streams != 0 && stranded_.largest_run >= bytes_) return reason::stranded;
    if (limit_ != 0) return reason::capped;
    if (stats_.free_bytes >= bytes_ && stats_.largest_free_block < bytes_) return reason::fragmented;
    return reason::exhausted;
  }

  /// For people: what was asked, what the resource held (live, reserved, free inside it and
  /// its largest free block), the cause, and what would have served the request. Allocates
  /// (what() does not); the C ABI returns it as vram_last_error().
  [[nodiscard]] virtual std::string explain() const {
    std::string s = std::string("vram: out of memory in ") + resource_ + ": " + format_bytes(bytes_) + " requested; " +
                    format_bytes(stats_.live_bytes) + " live, " + format_bytes(stats_.reserved_bytes) + " reserved, " +
                    format_bytes(stats_.free_bytes) + " free inside it";
    if (stats_.free_bytes != 0)
      s += " in " + std::to_string(stats_.free_blocks) + " blocks, the largest " + format_bytes(stats_.largest_free_block);
    s += ".\n";
    switch (cause()) {
      case reason::stranded: s += explain_stranding(); break;
      case reason::capped:
        s += std::string("cause: its ") + limit_name_ + " (" + format_bytes(limit_) + ") leaves less room than the request.\n" +
             "would serve it: a larger " + limit_name_ + ", or freeing " + format_bytes(bytes_) + " of what it holds.";
        break;
      case reason::fragmented:
        s += "cause: fragmentation: its free bytes would hold the request, but no free block is large enough.\n"
             "would serve it: a pool over a contiguous upstream (cuda_vmm_source), whose free ranges merge; or freeing "
             "the small blocks between the free ones (then release() and allocate again).";
        break;
      default:
        s += "cause: exhaustion: nothing free inside it holds the request, and its upstream (the device) has no more.\n"
             "would serve it: freeing live memory (the tracker names who holds it), a smaller request, or a larger "
             "device.";
        break;
    }
    return s + held_by();
  }

 protected:
  /// "\nheld by: tenant 'a' 3.00 GiB, 'b' 1.00 GiB; tags: 'kv_cache' 2.00 GiB, (untagged) 2.00 GiB"
  /// when holders are attached, else empty: the last line of every explain().
  [[nodiscard]] std::string held_by() const {
    const memory_holders& h = holders_;
    if (h.tenants == 0) return {};
    auto list = [](const auto& entries, std::size_t n, std::size_t total) {
      std::string out;
      for (std::size_t i = 0; i < n; ++i) {
        if (i != 0) out += ", ";
        out += entries[i].name[0] != '\0' ? "'" + std::string(entries[i].name.data()) + "' " : std::string("(untagged) ");
        out += format_bytes(entries[i].bytes);
      }
      if (total > n) out += ", and " + std::to_string(total - n) + " more";
      return out;
    };
    std::string s = "\nheld by: tenant " + list(h.tenant, h.tenants, h.total_tenants);
    bool only_untagged = h.tags == 1 && h.total_tags == 1 && h.tag[0].name[0] == '\0';
    if (h.tags != 0 && !only_untagged) s += "; tags: " + list(h.tag, h.tags, h.total_tags);
    return s + ".";
  }

  char message_[256];  // protected: derived errors format their own message

 private:
  /// How an explanation names a stream: by its key, the handle a profiler shows.
  static std::string stream_name(std::uintptr_t key) {
    if (key == 1) return "the CUDA default stream";  // stream_ref::cuda_default()'s key
    char buf[40];
    std::snprintf(buf, sizeof buf, "stream 0x%" PRIxPTR, key);
    return buf;
  }

  /// The cause and remedy lines of reason::stranded.
  [[nodiscard]] std::string explain_stranding() const {
    const stream_stranding& st = stranded_;
    std::string s = "cause: stranding: " + format_bytes(st.bytes) + " of its free blocks are keyed to " +
                    std::to_string(st.streams) + (st.streams == 1 ? " other stream" : " other streams") +
                    " with queued work, and do not merge with the free blocks beside them until that work is done; "
                    "ignoring stream keys, its largest run of adjacent free blocks is " +
                    format_bytes(st.largest_run) + ".\nstranded: ";
    std::string names;
    for (std::size_t i = 0; i < st.listed; ++i) {
      const stranded_stream& x = st.stream[i];
      if (i != 0) {
        s += "; ";
        names += i + 1 == st.listed && st.streams == st.listed ? " and " : ", ";
      }
      s += stream_name(x.stream_key) + " holds " + format_bytes(x.free_bytes) + " free (largest block " +
           format_bytes(x.largest_block) + ")";
      names += stream_name(x.stream_key);
    }
    if (st.streams > st.listed) {
      s += "; and " + std::to_string(st.streams - st.listed) + " more streams";
      names += " and the " + std::to_string(st.streams - st.listed) + " others";
    }
    const bool one = st.streams == 1;
    s += ".\nwould serve it: waiting for " + names + (one ? " (synchronize it, or let its" : " (synchronize them, or let their") +
         " queued work finish): " + (one ? "its" : "their") +
         " free blocks then merge with the ones beside them when the request is made again.";
    return s;
  }

  const char* resource_;
  std::size_t bytes_;
  stream_ref stream_;
  vram::stats stats_;
  std::size_t limit_;
  const char* limit_name_;
  stream_stranding stranded_;
  memory_holders holders_;
};

/// Thrown before the upstream is touched: granting `bytes` to `requester` would take
/// `limited` (the requester or one of its ancestors) past its hard limit. Allocates nothing.
class quota_exceeded : public out_of_memory {
 public:
  /// `resource`, `tenant_name` (the limited tenant's) and `requester_name` must outlive the
  /// exception (literals, registry names); a null `requester_name` is "id N" unless the
  /// requester is the limited tenant.
  quota_exceeded(const char* resource, std::size_t bytes, stream_ref stream, tenant requester, tenant limited,
                 const char* tenant_name, std::size_t limit, std::size_t usage,
                 const char* requester_name = nullptr) noexcept
      : out_of_memory(resource, bytes, stream),
        requester_(requester),
        limited_(limited),
        tenant_name_(tenant_name),
        requester_name_(requester_name != nullptr || requester.id != limited.id ? requester_name : tenant_name),
        limit_(limit),
        usage_(usage) {
    if (requester.id == limited.id)
      std::snprintf(message_, sizeof message_,
                    "vram: out of memory (quota exceeded) in %s: %zu bytes requested by tenant '%s' (id %u), which "
                    "uses %zu of its %zu byte limit",
                    resource, bytes, tenant_name, limited.id, usage, limit);
    else
      std::snprintf(message_, sizeof message_,
                    "vram: out of memory (quota exceeded) in %s: %zu bytes requested by tenant '%s' (id %u); tenant "
                    "'%s' (id %u) uses %zu of its %zu byte limit",
                    resource, bytes, requester_name_ != nullptr ? requester_name_ : "?", requester.id, tenant_name,
                    limited.id, usage, limit);
  }

  /// The tenant the request was made for.
  [[nodiscard]] tenant requester() const noexcept { return requester_; }
  /// The tenant whose hard limit refused it (the requester or an ancestor).
  [[nodiscard]] tenant limited_tenant() const noexcept { return limited_; }
  [[nodiscard]] const char* tenant_name() const noexcept { return tenant_name_; }
  /// The requester's name (null where the thrower did not give it).
  [[nodiscard]] const char* requester_name() const noexcept { return requester_name_; }
  [[nodiscard]] std::size_t limit() const noexcept { return limit_; }
  /// The limited tenant's usage when the request was refused (without the request).
  [[nodiscard]] std::size_t usage() const noexcept { return usage_; }

  [[nodiscard]] reason cause() const noexcept override { return reason::quota; }
  /// Every tenant as "tenant 'NAME' (id N)". The remedies are the ones that can work: a
  /// request above the limit itself needs a higher limit or a smaller request (freeing cannot
  /// make room the limit does not have); otherwise freeing what the limited tenant holds,
  /// which is then at least what is missing (usage + bytes - limit <= usage when bytes <= limit).
  [[nodiscard]] std::string explain() const override {
    const std::string limited = tenant_text(tenant_name_, limited_);
    std::string s = std::string("vram: out of memory (quota exceeded) in ") + resource() + ": " +
                    format_bytes(bytes()) + " requested by " + tenant_text(requester_name_, requester_) +
                    ".\ncause: " + limited + " uses " + format_bytes(usage_) + " of its " + format_bytes(limit_) +
                    " hard limit";
    const std::string raise = "a hard limit of at least " + format_bytes(usage_ + bytes()) + " for " + limited;
    if (bytes() > limit_) {
      // Room under the limit: what is left of it now, or all of it once the tenant's memory is freed.
      s += ", and the request alone is larger than that limit.\nwould serve it: " + raise +
           ", or the request split into pieces live at once of at most ";
      if (usage_ == 0) s += format_bytes(limit_) + ".";
      else if (usage_ < limit_)
        s += format_bytes(limit_ - usage_) + " (" + format_bytes(limit_) + " once " + limited + " frees what it holds).";
      else s += format_bytes(limit_) + " once " + limited + " frees what it holds.";
    } else {
      s += ".\nwould serve it: " + raise + ", or freeing " + format_bytes(usage_ + bytes() - limit_) + " of the " +
           format_bytes(usage_) + " that " + limited + " holds.";
    }
    return s + held_by();
  }

 private:
  static std::string tenant_text(const char* name, tenant t) {
    return (name != nullptr ? "tenant '" + std::string(name) + "' (id " : std::string("tenant (id ")) +
           std::to_string(t.id) + ")";
  }

  tenant requester_;
  tenant limited_;
  const char* tenant_name_;
  const char* requester_name_;
  std::size_t limit_;
  std::size_t usage_;
};

/// Thrown by budget_slab when its device budget is full and the spill source cannot take the
/// request either (its spill budget is full, or it failed). Names both budgets; allocates nothing.
class budgets_exhausted : public out_of_memory {
 public:
  /// `spill_budget` is ~0 for an unlimited spill budget.
  budgets_exhausted(const char* resource, std::size_t bytes, stream_ref stream, const vram::stats& snapshot,
                    std::size_t device_budget, std::size_t spill_budget) noexcept
      : out_of_memory(resource, bytes, stream, snapshot), device_budget_(device_budget), spill_budget_(spill_budget) {
    const std::size_t device_live = snapshot.live_bytes - snapshot.spilled_bytes;
    if (spill_budget == ~std::size_t{0})
      std::snprintf(message_, sizeof message_,
                    "vram: out of memory in %s: %zu bytes requested; device budget %zu bytes (%zu live) is full "
                    "and the spill source (unlimited budget, %zu spilled) failed",
                    resource, bytes, device_budget, device_live, snapshot.spilled_bytes);
    else
      std::snprintf(message_, sizeof message_,
                    "vram: out of memory in %s: %zu bytes requested; device budget %zu bytes (%zu live) and "
                    "spill budget %zu bytes (%zu spilled) are both exhausted",
                    resource, bytes, device_budget, device_live, spill_budget, snapshot.spilled_bytes);
  }
  [[nodiscard]] reason cause() const noexcept override { return reason::budgets; }
  [[nodiscard]] std::string explain() const override {
    return std::string(what()) + ".\ncause: both budgets are full.\nwould serve it: a larger spill budget, or freeing "
                                 "device or spilled memory." + held_by();
  }
  [[nodiscard]] std::size_t device_budget() const noexcept { return device_budget_; }
  /// ~0 when the spill budget is unlimited.
  [[nodiscard]] std::size_t spill_budget() const noexcept { return spill_budget_; }

 private:
  std::size_t device_budget_;
  std::size_t spill_budget_;
};

/// Thrown when a CUDA call fails for a reason other than memory exhaustion.
class cuda_error : public std::runtime_error {
 public:
  cuda_error(int code, const std::string& message) : std::runtime_error(message), code_(code) {}
  /// The cudaError_t (as int, so this header needs no CUDA headers; cast it back).
  [[nodiscard]] int code() const noexcept { return code_; }
#if VRAM_HAS_CUDA
  [[nodiscard]] cudaError_t error() const noexcept { return static_cast<cudaError_t>(code_); }
#endif

 private:
  int code_;
};

/// Thrown when a quota ledger (vram/adaptor/quota_ledger.hpp) cannot be created, attached or
/// used. The reason says what to fix; what() names the ledger's path.
class ledger_error : public std::runtime_error {
 public:
  enum class reason {
    not_found,       // no ledger at the path
    exists,          // create: a ledger (or something else) is already there
    permission,      // the files' modes refuse this access
    foreign,         // not a vram ledger (wrong magic, type or size)
    version,         // a vram ledger of another layout version
    truncated,       // shorter than its layout
    corrupted,       // checksum, tenant tree or usage totals do not hold
    mismatched,      // its two files belong to different ledgers
    full,            // no free tenant or process slot
    unknown_tenant,  // no tenant at that path
    read_only,       // the change needs access this handle does not have
    forked,          // used in a child of fork() through the parent's handle
    system,          // the operating system refused (errno in the message)
  };
  ledger_error(reason r, const std::string& message) : std::runtime_error(message), reason_(r) {}
  [[nodiscard]] reason why() const noexcept { return reason_; }

 private:
  reason reason_;
};

/// Thrown for requests that can never succeed: alignment not a power of two or too large,
/// a size beyond any capacity, a configuration that contradicts itself.
class invalid_argument : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// Thrown when memory is requested from a device's resource while a different device is
/// current: the memory would live on a device the calling code's kernels do not run on.
/// Carries both device ids; what() allocates nothing beyond the base class message.
class wrong_device : public invalid_argument {
 public:
  wrong_device(const char* resource, int expected, int actual)
      : invalid_argument("vram: resource used on the wrong device"), expected_(expected), actual_(actual) {
    std::snprintf(message_, sizeof message_, "vram: %s: resource of device %d used while device %d is current",
                  resource, expected, actual);
  }
  [[nodiscard]] const char* what() const noexcept override { return message_; }
  /// The device the resource belongs to.
  [[nodiscard]] int expected_device() const noexcept { return expected_; }
  /// The device that was current.
  [[nodiscard]] int current_device() const noexcept { return actual_; }

 private:
  char message_[160];
  int expected_;
  int actual_;
};

}  // namespace vram
