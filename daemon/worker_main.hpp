// `tandemd --worker ...`: a prefill or decode worker process (same binary) that runs batches
// over the shared KV pool.
#pragma once

namespace tandem::daemon {

// The worker process's main. Returns the exit status.
int worker_main(int argc, char** argv);

} // namespace tandem::daemon
