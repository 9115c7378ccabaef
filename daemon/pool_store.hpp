// The prefix cache's page table kept in the shared pool's segment (so a restarted daemon
// finds its cache), and page copies done there.
#pragma once

#include "ipc/kv_pool.hpp"
#include "runtime/scheduler.hpp"

#include <memory>

namespace tandem::daemon {

std::unique_ptr<page_store> make_pool_store(ipc::kv_pool& pool);
// Hands the valid entries of the segment's page table to the scheduler (oldest first);
// returns how many pages were restored.
int32_t restore_prefix_cache(ipc::kv_pool& pool, scheduler& s);

} // namespace tandem::daemon
