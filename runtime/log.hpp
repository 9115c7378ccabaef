// One logging facade: spdlog, a named logger per subsystem, level from TANDEM_LOG or config.
#pragma once

#include <spdlog/spdlog.h>

#include <memory>
#include <string_view>

namespace tandem {

// Sets the level of every subsystem logger ("trace".."off"); TANDEM_LOG overrides `level` (a
// TANDEM_LOG that names no level is ignored, with a warning).
// Logs go to stderr; under journald (JOURNAL_STREAM set) lines carry no timestamp.
void init_logging(std::string_view level = "info");

// The logger of one subsystem ("gguf", "model", "engine", ...), created on first use.
std::shared_ptr<spdlog::logger> logger(std::string_view subsystem);

} // namespace tandem
