// `tandem pull | ls | rm | show | alias`: the model store from the command line (docs/models.md).
#include "daemon/cli.hpp"

#include "daemon/hub.hpp"
#include "daemon/model_store.hpp"
#include "runtime/error.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <memory>

namespace tandem::cli {

namespace {

using ojson = nlohmann::ordered_json;
using daemon::model_manifest;
using daemon::model_store;

struct models_opts {
    std::string store;                 // "" = daemon::default_store_dir()
    std::string name, target, revision = "main";
    int retries = 5;
    bool json = false, quiet = false;
};

std::string size_text(double b) {
    if (b < 1024.0 * 1024) return fmt::format("{:.0f} KiB", b / 1024);
    if (b < 1024.0 * 1024 * 1024) return fmt::format("{:.1f} MiB", b / (1024.0 * 1024));
    return fmt::format("{:.2f} GiB", b / (1024.0 * 1024 * 1024));
}

void add_store_flag(CLI::App* sub, models_opts& o) {
    sub->add_option("--store", o.store, "the model store (default: $TANDEM_MODELS, else /var/lib/tandem/models for root, "
                                        "else $XDG_DATA_HOME/tandem/models or ~/.local/share/tandem/models)");
}

int cmd_pull(const models_opts& o) {
    std::string why;
    std::optional<daemon::hub::reference> ref = daemon::hub::parse_reference(o.name, &why);
    if (!ref) throw error(why);
    if (o.revision != "main") ref->revision = o.revision;
    daemon::hub::pull_options po;
    po.retries = o.retries;
    if (o.quiet) po.progress = 0;
    const model_store store(o.store);
    const model_manifest m = daemon::hub::pull(*ref, store, po);
    if (o.json) write_out(m.to_json().dump() + "\n");
    else write_out(fmt::format("pulled {} ({}, {}, {} file{}) into {}\n", m.name, size_text(double(m.size)),
                               m.quantization.empty() ? "?" : m.quantization, m.files.size(), m.files.size() == 1 ? "" : "s",
                               store.dir().string()));
    return 0;
}

int cmd_ls(const models_opts& o) {
    const model_store store(o.store);
    const std::vector<model_manifest> all = store.list();
    if (o.json) {
        ojson j = ojson::array();
        for (const model_manifest& m : all) j.push_back(m.to_json());
        write_out(j.dump() + "\n");
        return 0;
    }
    size_t w = 4;
    for (const model_manifest& m : all) w = std::max(w, m.name.size());
    std::string out = fmt::format("{:<{}}  {:>10}  {:<8}  {:<10}  {:<20}  {}\n", "NAME", w, "SIZE", "QUANT", "ARCH",
                                  "ADDED", "SOURCE");
    for (const model_manifest& m : all)
        out += fmt::format("{:<{}}  {:>10}  {:<8}  {:<10}  {:<20}  {}\n", m.name, w, size_text(double(m.size)),
                           m.quantization.empty() ? "-" : m.quantization, m.architecture.empty() ? "-" : m.architecture,
                           m.pulled_at, m.kind == "alias" ? "alias of " + m.source : m.source);
    write_out(out);
    if (all.empty()) std::fprintf(stderr, "(no models in %s: tandem pull NAME adds one)\n", store.dir().c_str());
    return 0;
}

int cmd_rm(const models_opts& o) {
    const model_store store(o.store);
    std::string why;
    const std::optional<model_manifest> m = store.find(o.name, &why);
    if (!m) throw error(why);
    store.remove(m->name);
    write_out(fmt::format("removed {}\n", m->name));
    return 0;
}

int cmd_show(const models_opts& o) {
    const model_store store(o.store);
    std::string why;
    const std::optional<model_manifest> m = store.find(o.name, &why);
    if (!m) throw error(why);
    const std::vector<std::string> paths = store.paths(*m);
    if (!o.json) {
        std::string out = fmt::format("{}\n  source         {}{}\n", m->name, m->kind == "alias" ? "alias of " : "", m->source);
        if (!m->revision.empty()) out += fmt::format("  revision       {}\n", m->revision);
        out += fmt::format("  added          {}\n", m->pulled_at);
        for (size_t i = 0; i < m->files.size(); ++i)
            out += fmt::format("  file           {} ({}{})\n", paths[i], size_text(double(m->files[i].size)),
                               m->files[i].sha256.empty() ? "" : ", sha256 " + m->files[i].sha256);
        write_out(out);
    }
    print_model_info(paths.front(), o.json, m->to_json());
    return 0;
}

int cmd_alias(const models_opts& o) {
    const model_store store(o.store);
    const model_manifest m = store.alias(o.name, o.target);
    write_out(fmt::format("{} -> {}\n", m.name, m.source));
    return 0;
}

} // namespace

void register_models(CLI::App& app, registry& reg) {
    auto o = std::make_shared<models_opts>();
    auto* pull = app.add_subcommand("pull", "download a GGUF model from a Hugging Face hub into the model store "
                                            "(HF_ENDPOINT, HF_TOKEN and the proxy variables are honoured)");
    pull->add_option("name", o->name, "org/repo (its Q4_K_M), org/repo:QUANT, org/repo/FILE.gguf, or an hf.co/ or "
                                      "https://huggingface.co/ link")
        ->required();
    pull->add_option("--revision", o->revision, "branch, tag or commit of the repository (default main)");
    pull->add_option("--retries", o->retries, "resumed attempts after a dropped connection, per file (default 5)")
        ->check(at_least(0));
    pull->add_flag("-q,--quiet", o->quiet, "no progress");
    pull->add_flag("--json", o->json, "print the manifest written");
    add_store_flag(pull, *o);
    reg.push_back({pull, [o] { return cmd_pull(*o); }});

    auto* ls = app.add_subcommand("ls", "list the models in the store");
    ls->add_flag("--json", o->json, "the manifests, as one JSON array");
    add_store_flag(ls, *o);
    reg.push_back({ls, [o] { return cmd_ls(*o); }});

    auto* rm = app.add_subcommand("rm", "remove a model from the store (its files, unless another name uses them)");
    rm->add_option("name", o->name, "the model's name (tandem ls)")->required();
    add_store_flag(rm, *o);
    reg.push_back({rm, [o] { return cmd_rm(*o); }});

    auto* show = app.add_subcommand("show", "a stored model: its source, files, and what tandem info says of it");
    show->add_option("name", o->name, "the model's name (tandem ls)")->required();
    show->add_flag("--json", o->json, "{\"manifest\": ..., \"info\": ...}");
    add_store_flag(show, *o);
    reg.push_back({show, [o] { return cmd_show(*o); }});

    auto* alias = app.add_subcommand("alias", "name a GGUF file (or another stored model) in the store, without copying it");
    alias->add_option("name", o->name, "the new name")->required();
    alias->add_option("path", o->target, "a GGUF file, or a name in the store")->required();
    add_store_flag(alias, *o);
    reg.push_back({alias, [o] { return cmd_alias(*o); }});
}

} // namespace tandem::cli
