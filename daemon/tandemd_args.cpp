// tandemd's options and how they override the config file.
#include "daemon/tandemd_args.hpp"

#include "daemon/cli_args.hpp"
#include "daemon/model_store.hpp"
#include "runtime/error.hpp"

#include <filesystem>

namespace tandem::daemon {

void add_options(CLI::App& app, tandemd_args& a) {
    app.add_option("--config", a.config_file, "config file of `key = value` lines (docs/config.md)");
    app.add_option("-m,--model", a.model, "GGUF model file (default: the installed demo model, share/tandem/models/stories260K.gguf)");
    app.add_option("--chat-template", a.chat_template, "Jinja chat template file that replaces the model's (docs/chat_templates.md)");
    app.add_option("--socket", a.socket, "Unix socket path (default $XDG_RUNTIME_DIR/tandem/tandem.sock, or /run/tandem/tandem.sock as root)");
    app.add_option("-t,--threads", a.threads, "compute threads (default 0: all cores)")->check(cli::at_least(0));
    app.add_option("--listen-tcp", a.listen_tcp, "also listen on a loopback TCP address, e.g. 127.0.0.1:8080");
    app.add_option("--log", a.log_level, "log level: trace, debug, info, warn, error, off (or TANDEM_LOG)");
    app.add_option("--set", a.sets, "KEY=VALUE for any config key (repeatable)");
    app.add_flag("--list-keys", a.list_keys, "print the config keys and exit");
}

void apply_sets(const std::vector<std::string>& sets, config& cfg) {
    for (const auto& s : sets) {
        const auto eq = s.find('=');
        if (eq == std::string::npos) fail("--set {}: expected KEY=VALUE", s);
        if (auto err = cfg.set(s.substr(0, eq), s.substr(eq + 1))) fail("--set {}: {}", s.substr(0, eq), *err);
        cfg.origin[s.substr(0, eq)] = "--set";
    }
}

void resolve_store_model(config& cfg) {
    // A path (an existing file, or one that looks like a path) is the loader's to open.
    std::error_code ec;
    if (std::filesystem::exists(cfg.model, ec) || cfg.model.ends_with(".gguf") || cfg.model.starts_with('/') ||
        cfg.model.starts_with('.'))
        return;
    // A [model NAME] section's name: the model host's to resolve.
    for (const auto& m : cfg.models)
        if (m.name == cfg.model) return;
    const resolve_result r = locate_model(cfg.model, cfg.store);
    if (!r.model) {
        const auto at = cfg.origin.find("model");
        fail("{}model: {}", at == cfg.origin.end() ? "" : at->second + ": ", r.error);
    }
    if (r.model->manifest) { // a name in the store: serve its file, under its name
        if (cfg.model_id.empty()) cfg.model_id = r.model->id;
        cfg.model = r.model->paths.front();
    }
}

bool apply_args(const tandemd_args& a, config& cfg) {
    auto put = [&](const std::string& k, const std::string& v) {
        if (auto err = cfg.set(k, v)) fail("--{}: {}", k, *err);
        cfg.origin[k] = "command line";
    };
    if (!a.model.empty()) put("model", a.model);
    if (!a.chat_template.empty()) put("chat_template", a.chat_template);
    if (!a.socket.empty()) put("socket", a.socket);
    if (a.threads >= 0) put("threads", std::to_string(a.threads));
    if (!a.listen_tcp.empty()) put("listen_tcp", a.listen_tcp);
    if (!a.log_level.empty()) put("log_level", a.log_level);
    apply_sets(a.sets, cfg);
    const bool demo_model = cfg.model.empty() && cfg.models.empty(); // (else the first [model] is the default)
    if (demo_model) cfg.model = default_model_path(); // the installed demo model, if any
    cfg.validate();
    resolve_store_model(cfg);
    return demo_model;
}

} // namespace tandem::daemon
