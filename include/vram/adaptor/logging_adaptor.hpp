#pragma once
// vram::logging_adaptor<Upstream>: writes every allocation, free and failure as a line of
// RMM's CSV log (Thread,Time,Action,Pointer,Size,Stream) plus a Tenant column — the format
// vram-replay and RMM's replay benchmark read back.

#include <cstddef>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <ostream>
#include <string>
#include <thread>
#include <utility>

#include <vram/core/concepts.hpp>
#include <vram/core/error.hpp>
#include <vram/core/tenant.hpp>
#include <vram/core/throw.hpp>
#include <vram/adaptor/detail/adaptor_base.hpp>
#include <vram/trace/detail/rmm_csv.hpp>
#include <vram/adaptor/detail/tracker/records.hpp>

namespace vram {

/// Logs what passes through it, one CSV line per event, under a mutex.
///
/// Lines: "allocate" (after the upstream succeeded), "free" (when deallocate is called, before
/// the upstream), "allocate failure" (the upstream threw out_of_memory; pointer "(nil)").
/// The Tenant column is the current tenant's path ("job/model_a"); frees are logged with the
/// tenant in scope at the free. Nothing is validated: the upstream reports misuse.
/// Thread safety: thread-safe (one mutex around each line). Streams, alignment: the
/// upstream's. Upstream: held by value; copies share the log. The log is flushed by flush()
/// and when the last copy is destroyed. Capabilities: those of adaptor_base (stats, release,
/// owns, try_allocate, check_invariants pass through). Complexity: O(1) plus the write.
template <class Upstream>
class logging_adaptor : public detail::adaptor::adaptor_base<logging_adaptor<Upstream>, Upstream> {
  using base = detail::adaptor::adaptor_base<logging_adaptor<Upstream>, Upstream>;
  using base::upstream_;

 public:
  /// Logs to the file at `path` (truncated). Throws invalid_argument when it cannot be opened.
  logging_adaptor(Upstream upstream, const std::string& path,
                  std::shared_ptr<const tenant_registry> registry = tenant_registry::global())
      : base(std::move(upstream)), state_(std::make_shared<state>(std::move(registry))) {
    state_->file = std::make_unique<std::ofstream>(path, std::ios::trunc);
    if (!*state_->file) detail::throw_invalid_argument(name(), "cannot open the log file");
    state_->out = state_->file.get();
    *state_->out << detail::trace::rmm_csv_header;
  }
  /// Logs to `out`, which must outlive every copy of this adaptor.
  logging_adaptor(Upstream upstream, std::ostream& out,
                  std::shared_ptr<const tenant_registry> registry = tenant_registry::global())
      : base(std::move(upstream)), state_(std::make_shared<state>(std::move(registry))) {
    state_->out = &out;
    out << detail::trace::rmm_csv_header;
  }

  [[nodiscard]] static constexpr const char* name() noexcept { return "logging_adaptor"; }

  void* allocate(stream_ref s, std::size_t bytes, std::size_t align = default_alignment) {
    void* p;
    try {
      p = upstream_.allocate(s, bytes, align);
    } catch (const out_of_memory&) {
      log("allocate failure", nullptr, bytes, s);
      throw;
    }
    if (p != nullptr) log("allocate", p, bytes, s);
    return p;
  }
  void deallocate(stream_ref s, void* p, std::size_t bytes, std::size_t align = default_alignment) noexcept {
    if (p != nullptr) log("free", p, bytes, s);
    upstream_.deallocate(s, p, bytes, align);
  }
  void* allocate_sync(std::size_t bytes, std::size_t align = default_alignment) {
    return allocate(stream_ref{}, bytes, align);
  }
  void deallocate_sync(void* p, std::size_t bytes, std::size_t align = default_alignment) noexcept {
    deallocate(stream_ref{}, p, bytes, align);
  }

  void flush() {
    std::lock_guard lock(state_->mutex);
    state_->out->flush();
  }

  friend bool operator==(const logging_adaptor& a, const logging_adaptor& b) {
    return a.state_ == b.state_ && a.upstream_ == b.upstream_;
  }

 private:
  struct state {
    explicit state(std::shared_ptr<const tenant_registry> r) : registry(std::move(r)) {
      if (!registry) detail::throw_invalid_argument("logging_adaptor", "null tenant registry");
    }
    ~state() {
      if (out != nullptr) out->flush();
    }
    std::mutex mutex;
    std::ostream* out = nullptr;
    std::unique_ptr<std::ofstream> file;
    std::shared_ptr<const tenant_registry> registry;
  };

  void log(const char* action, const void* p, std::size_t bytes, stream_ref s) noexcept {
    try {
      auto thread = std::hash<std::thread::id>{}(std::this_thread::get_id());
      auto path = detail::tracker::tenant_path(*state_->registry, current_tenant());
      auto now = detail::tracker::tracker_now_us();
      std::lock_guard lock(state_->mutex);
      detail::trace::write_rmm_csv_line(*state_->out, thread, now, action, reinterpret_cast<std::uintptr_t>(p), bytes,
                                 s.key(), path);
    } catch (...) {  // logging is best effort: it must not break deallocation
    }
  }

  std::shared_ptr<state> state_;
};

}  // namespace vram

#include <vram/source/host_source.hpp>
static_assert(vram::resource<vram::logging_adaptor<vram::host_source>>);
