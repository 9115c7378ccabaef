// tandemd's command line: its options, and the configuration they make over the config file.
#pragma once

#include "daemon/config.hpp"

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

namespace tandem::daemon {

struct tandemd_args {
    std::string config_file, model, chat_template, socket, listen_tcp, log_level;
    int threads = -1;               // -1: not given
    std::vector<std::string> sets;  // --set KEY=VALUE, in order
    bool list_keys = false;
};

// tandemd's options, parsed into `a`.
void add_options(CLI::App& app, tandemd_args& a);

// Each `--set KEY=VALUE` of `sets` over `cfg`, in order (origin "--set"). Throws
// tandem::error "--set KEY: problem".
void apply_sets(const std::vector<std::string>& sets, config& cfg);

// `model` as a name in the store (`store`, else default_store_dir()): its file, and model_id
// the name unless one is set. A path is left as it is. Throws tandem::error "model: ..." with
// the names the store has when the name is not there.
void resolve_store_model(config& cfg);

// The flags over `cfg` (the config file's, loaded first): each flag, then each --set, the
// installed demo model when no model is set, then validate() and resolve_store_model(). Returns whether the demo model
// was chosen. Throws tandem::error "--KEY: problem" (or validate()'s).
bool apply_args(const tandemd_args& a, config& cfg);

} // namespace tandem::daemon
