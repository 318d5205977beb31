#pragma once
// What the tracker's tests share: a job with two models as tenants, and a stream_pool
// observed by a tracker_observer with half of its blocks freed (its snapshot then holds
// segments with both allocated and inactive blocks).

#include <cstddef>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include <vram/adaptor/tracker_observer.hpp>
#include <vram/alloc/stream_pool.hpp>
#include <vram/core/tenant.hpp>
#include <vram/source/host_source.hpp>

#include "support/recording_resource.hpp"

namespace vram::test {

/// job, job/model_a and job/model_b.
struct tenants {
  std::shared_ptr<vram::tenant_registry> reg = std::make_shared<vram::tenant_registry>();
  vram::tenant job = reg->create("job");
  vram::tenant model_a = reg->create("model_a", job);
  vram::tenant model_b = reg->create("model_b", job);
};

/// A stream_pool (4 MiB growth) over a recording host upstream, observed by `tracker`:
/// twelve 1 MiB blocks allocated by job/model_a under the tag "weights", the even ones freed.
/// release() frees the rest and destroys the pool.
struct half_freed_pool {
  using upstream_t = recording_resource<vram::host_source>;
  using pool_t = vram::stream_pool<upstream_t, vram::tracker_observer>;

  tenants t;
  upstream_t up;
  vram::tracker_observer tracker{{.registry = t.reg}};
  std::optional<pool_t> pool;
  std::vector<std::pair<void*, std::size_t>> live;

  half_freed_pool() {
    pool.emplace(up, vram::stream_pool_options{.growth_step = std::size_t{4} << 20}, tracker);
    {
      vram::tenant_scope ts(t.model_a);
      vram::tag_scope tag("weights");
      for (std::size_t i = 0; i < 12; ++i) live.emplace_back(pool->allocate_sync(1 << 20), 1 << 20);
    }
    for (std::size_t i = 0; i < live.size(); i += 2) pool->deallocate_sync(live[i].first, live[i].second);
  }
  half_freed_pool(const half_freed_pool&) = delete;  // the pool refers to its members
  half_freed_pool& operator=(const half_freed_pool&) = delete;

  void release() {
    for (std::size_t i = 1; i < live.size(); i += 2) pool->deallocate_sync(live[i].first, live[i].second);
    pool.reset();
  }
};

}  // namespace vram::test
