// `tandem info MODEL`: what a GGUF holds and what it will cost, from its metadata and tensor
// infos alone (the weights are mapped, never read or converted, so it is instant on any size).
#include "daemon/cli.hpp"

#include "quant/lowbit.hpp"
#include "runtime/chat_template.hpp"
#include "runtime/gguf.hpp"
#include "runtime/grammar/tool_call.hpp"
#include "runtime/reasoning.hpp"
#include "runtime/kv_layout.hpp"
#include "runtime/model_config.hpp"
#include "runtime/tokenizer.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <string>

namespace tandem::cli {

namespace {

using ojson = nlohmann::ordered_json;

struct info_opts {
    std::string model;
    std::string kv = "f16";
    std::string weights = "auto";
    int32_t page_size = 16;
    bool json = false;
};

// 640 bytes, 22.0 KiB, 704.0 MiB, 2.0 GiB.
std::string size_text(double bytes) {
    if (bytes < 1024) return fmt::format("{:.0f} bytes", bytes);
    if (bytes < 1024.0 * 1024) return fmt::format("{:.1f} KiB", bytes / 1024);
    if (bytes < 1024.0 * 1024 * 1024) return fmt::format("{:.1f} MiB", bytes / (1024.0 * 1024));
    return fmt::format("{:.2f} GiB", bytes / (1024.0 * 1024 * 1024));
}

// A token's id and its text, or null when the model has none.
ojson token_json(const tokenizer& tok, token_id id) {
    if (id < 0 || id >= tok.n_vocab()) return nullptr;
    return ojson{{"id", id}, {"text", tok.piece(id, /*render_special=*/true)}};
}

// What the weights take once loaded as the engine holds them (runtime/weight.hpp): every
// matrix as INT8 rows, each with an F32 scale and an INT32 row sum, or (lowbit) a matrix the
// file holds in a low-bit format in the low-bit family's layout
// (quant/lowbit.hpp); vectors as F32. The scale tensors of a pre-quantized file are part of
// their matrices. formats: the low-bit formats kept.
// A mixture of experts' 3-D expert tensors count as one matrix per expert, and the router
// (ffn_gate_inp) stays F32. expert_bytes: the routed experts' share; table_bytes: the
// embedding table's, when the logits do not read it too.
struct weight_sizes {
    int64_t bytes = 0, expert_bytes = 0, table_bytes = 0;
};
weight_sizes weight_bytes(const gguf::file& f, bool lowbit, std::map<std::string, int>& formats, bool& any_int8) {
    weight_sizes w;
    any_int8 = false;
    for (const gguf::tensor_info& t : f.tensors()) {
        if (t.name.ends_with(".scale") && f.find_tensor(t.name.substr(0, t.name.size() - 6))) continue;
        const bool experts = t.ne.size() == 3;
        const bool matrix = (t.ne.size() == 2 || experts) && !t.name.ends_with("ffn_gate_inp.weight");
        const int64_t n_mat = experts ? t.ne[2] : 1;
        int64_t b = 0;
        if (matrix && lowbit && is_lowbit_format(t.type)) {
            const lowbit_matrix m = lowbit_layout_of(t.type, t.ne[1], t.ne[0]);
            b = n_mat * m.n_tiles() * m.n_super() * m.super_bytes;
            ++formats[std::string(name_of(t.type))];
        } else if (matrix) {
            b = n_mat * t.ne[1] * (t.ne[0] + 4 + 4);
            any_int8 = true;
        } else {
            b = t.n_elements() * 4;
        }
        w.bytes += b;
        if (experts) w.expert_bytes += b;
        if (t.name == "token_embd.weight" && f.find_tensor("output.weight")) w.table_bytes = b;
    }
    return w;
}

ojson describe(const std::string& path, const info_opts& o) {
    const gguf::file f = gguf::file::open(path);
    const model_config c = model_config::from_gguf(f);
    const tokenizer tok = tokenizer::from_gguf(f);
    const chat_template tmpl = chat_template::from_gguf(f, tok);

    ojson j;
    j["path"] = path;
    j["file_bytes"] = f.bytes().size();
    j["gguf_version"] = f.version();
    j["arch"] = c.arch;
    j["name"] = c.name;
    j["shapes"] = {{"n_layer", c.n_layer}, {"n_embd", c.n_embd},   {"n_head", c.n_head}, {"n_head_kv", c.n_head_kv},
                   {"head_dim", c.head_dim}, {"n_ff", c.n_ff}, {"n_vocab", c.n_vocab}};

    std::map<std::string, std::pair<int64_t, int64_t>> types; // name: count, bytes
    int64_t tensor_bytes = 0;
    for (const gguf::tensor_info& t : f.tensors()) {
        auto& [n, b] = types[std::string(name_of(t.type))];
        ++n;
        b += int64_t(t.n_bytes);
        tensor_bytes += int64_t(t.n_bytes);
    }
    ojson tj = ojson::object();
    for (const auto& [name, nb] : types) tj[name] = {{"count", nb.first}, {"bytes", nb.second}};
    j["tensors"] = {{"count", f.tensors().size()}, {"bytes", tensor_bytes}, {"types", tj}};

    j["n_ctx_train"] = c.n_ctx_train;
    int32_t n_windowed = 0;
    for (const uint8_t w : c.layer_windowed) n_windowed += w != 0;
    j["sliding_window"] = {{"size", c.sliding_window}, {"layers", n_windowed}};

    ojson scaling = {{"type", "none"}};
    if (c.yarn.factor > 0)
        scaling = {{"type", "yarn"}, {"factor", c.yarn.factor}, {"original_context", c.yarn.orig_ctx}};
    else if (f.find_tensor("rope_freqs.weight"))
        scaling = {{"type", "llama3"}, {"factors", "rope_freqs.weight"}};
    else if (c.rope_freq_scale != 1.0f)
        scaling = {{"type", "linear"}, {"factor", 1.0 / double(c.rope_freq_scale)}};
    j["rope"] = {{"base", c.rope_freq_base},
                 {"dims", c.n_rot},
                 {"style", c.rope == rope_style::neox ? "neox" : "normal"},
                 {"scaling", scaling}};
    if (c.rope_freq_base_swa > 0) j["rope"]["base_windowed"] = c.rope_freq_base_swa;

    j["chat_template"] = {{"family", std::string(name_of(tmpl.family()))},
                          {"in_file", f.get_string("tokenizer.chat_template").has_value()},
                          {"renderer", tmpl.renderer_name()},
                          {"tool_syntax", std::string(grammar::name_of(tmpl.tool_syntax()))}};
    if (!tmpl.uses_jinja()) j["chat_template"]["renderer_note"] = tmpl.jinja_error();
    // The thinking's markers (runtime/reasoning): from the template's source and the vocabulary.
    const std::optional<reasoning_format> thinking =
        find_reasoning(f.get_string("tokenizer.chat_template").value_or(std::string()), tok);
    j["chat_template"]["reasoning"] =
        thinking ? ojson{{"open", thinking->open}, {"close", thinking->close}, {"can_disable", thinking->can_disable}}
                 : ojson(nullptr);
    j["tokenizer"] = {{"model", std::string(tok.kind())},
                      {"pre", std::string(tok.pre())},
                      {"n_vocab", tok.n_vocab()},
                      {"bos", token_json(tok, tok.bos())},
                      {"eos", token_json(tok, tok.eos())},
                      {"add_bos", tok.add_bos()}};

    // What serving it takes: the weights in their family (--weights), and the KV cache as
    // tandemd's pool holds it.
    std::map<std::string, int> kept;
    bool any_int8 = false;
    const weight_sizes ws = weight_bytes(f, o.weights == "auto", kept, any_int8);
    const int64_t wbytes = ws.bytes;
    // A mixture of experts reads n_expert_used of n_expert experts a token: its active
    // parameters and the bytes a decode step reads per token (every weight but the embedding
    // table's other rows, and only the chosen experts).
    int64_t n_params = 0, n_expert_params = 0;
    for (const gguf::tensor_info& t : f.tensors()) {
        if (t.name.ends_with(".scale") && f.find_tensor(t.name.substr(0, t.name.size() - 6))) continue;
        n_params += t.n_elements();
        if (t.ne.size() == 3) n_expert_params += t.n_elements();
    }
    const double used = c.is_moe() ? double(c.n_expert_used) / c.n_expert : 1.0;
    j["parameters"] = {{"total", n_params}, {"active", n_params - int64_t(double(n_expert_params) * (1 - used))}};
    if (c.is_moe())
        j["experts"] = {{"count", c.n_expert},
                        {"used", c.n_expert_used},
                        {"n_ff_exp", c.n_ff_exp},
                        {"n_ff_shared", c.n_ff_shexp},
                        {"renormalised", c.expert_norm}};
    const int64_t decode_bytes = wbytes - ws.table_bytes - int64_t(double(ws.expert_bytes) * (1 - used));
    std::string family = kept.empty() ? "int8" : any_int8 ? "low-bit + int8" : "low-bit";
    ojson kept_j = ojson::object();
    for (const auto& [name, n] : kept) kept_j[name] = n;
    const kv_dtype kv = *parse_kv_dtype(o.kv);
    const kv_layout layout{c.n_layer, c.n_head_kv, c.head_dim, o.page_size, kv};
    const double token_bytes = double(layout.page_bytes()) / o.page_size;
    j["memory"] = {{"weights", family},
                   {"lowbit_matrices", kept_j},
                   {"weight_bytes", wbytes},
                   {"expert_bytes", ws.expert_bytes},
                   {"decode_bytes_per_token", decode_bytes},
                   {"kv_dtype", o.kv},
                   {"kv_bytes_per_token", token_bytes},
                   {"kv_bytes_train_context", int64_t(token_bytes * c.n_ctx_train + 0.5)}};
    return j;
}

void print_text(const ojson& j) {
    const auto& s = j["shapes"];
    std::string out = fmt::format("{}: {} ({}), GGUF v{}, {}\n", j["path"].get<std::string>(), j["arch"].get<std::string>(),
                                  j["name"].get<std::string>(), j["gguf_version"].get<int>(),
                                  size_text(j["file_bytes"].get<double>()));
    out += fmt::format("  shapes         {} layers, embd {}, heads {}, kv heads {}, head_dim {}, ff {}, vocab {}\n",
                       s["n_layer"].get<int>(), s["n_embd"].get<int>(), s["n_head"].get<int>(),
                       s["n_head_kv"].get<int>(), s["head_dim"].get<int>(), s["n_ff"].get<int>(),
                       s["n_vocab"].get<int>());
    const auto count_text = [](int64_t n) {
        return n >= 1000000000 ? fmt::format("{:.2f}B", double(n) / 1e9)
               : n >= 1000000  ? fmt::format("{:.1f}M", double(n) / 1e6)
                               : fmt::format("{:.1f}K", double(n) / 1e3);
    };
    const int64_t total = j["parameters"]["total"].get<int64_t>(), active = j["parameters"]["active"].get<int64_t>();
    if (j.contains("experts")) {
        const auto& x = j["experts"];
        out += fmt::format("  experts        {} a layer, {} used a token ({}), ff {}{}\n", x["count"].get<int>(),
                           x["used"].get<int>(), x["renormalised"].get<bool>() ? "renormalised" : "not renormalised",
                           x["n_ff_exp"].get<int>(),
                           x["n_ff_shared"].get<int>() > 0 ? fmt::format(", shared expert ff {}", x["n_ff_shared"].get<int>())
                                                           : std::string());
        out += fmt::format("  parameters     {} total, {} active a token\n", count_text(total), count_text(active));
    } else {
        out += fmt::format("  parameters     {}\n", count_text(total));
    }
    std::string types;
    for (const auto& [name, t] : j["tensors"]["types"].items())
        types += fmt::format("{}{} x{} ({})", types.empty() ? "" : ", ", name, t["count"].get<int64_t>(),
                             size_text(t["bytes"].get<double>()));
    out += fmt::format("  tensors        {} ({}): {}\n", j["tensors"]["count"].get<int64_t>(),
                       size_text(j["tensors"]["bytes"].get<double>()), types.empty() ? "none" : types);
    out += fmt::format("  context        {} tokens (training)\n", j["n_ctx_train"].get<int>());
    const auto& w = j["sliding_window"];
    out += w["size"].get<int>() > 0
               ? fmt::format("  sliding window {} tokens on {} of {} layers\n", w["size"].get<int>(),
                             w["layers"].get<int>(), s["n_layer"].get<int>())
               : std::string("  sliding window none\n");
    const auto& r = j["rope"];
    const auto& sc = r["scaling"];
    std::string scaling = sc["type"].get<std::string>();
    if (scaling == "linear") scaling = fmt::format("linear x{}", sc["factor"].get<double>());
    else if (scaling == "yarn")
        scaling = fmt::format("yarn x{} of {} tokens", sc["factor"].get<double>(), sc["original_context"].get<int>());
    else if (scaling == "llama3") scaling = "llama3 (rope_freqs.weight)";
    out += fmt::format("  rope           base {}{}, {} of {} dims, {}, scaling {}\n", r["base"].get<double>(),
                       r.contains("base_windowed") ? fmt::format(" (windowed layers {})", r["base_windowed"].get<double>())
                                                   : std::string(),
                       r["dims"].get<int>(), s["head_dim"].get<int>(), r["style"].get<std::string>(), scaling);
    const auto& ct = j["chat_template"];
    const std::string thinks = ct["reasoning"].is_null()
                                   ? std::string("no thinking markers")
                                   : fmt::format("thinking {} ... {}", ct["reasoning"]["open"].get<std::string>(),
                                                 ct["reasoning"]["close"].get<std::string>());
    out += fmt::format("  chat template  {}; family {} (tool calls {}; {}){}\n",
                       ct["renderer"].get<std::string>() == "jinja" ? "the file's own (Jinja)" : "the family's format",
                       ct["family"].get<std::string>(), ct["tool_syntax"].get<std::string>(), thinks,
                       ct["in_file"].get<bool>() ? (ct.contains("renderer_note") ? " (" + ct["renderer_note"].get<std::string>() + ")" : "")
                                                 : " (the file has none)");
    const auto& t = j["tokenizer"];
    const auto tok_text = [](const ojson& x) {
        return x.is_null() ? std::string("none") : fmt::format("{} {}", x["id"].get<int>(), ojson(x["text"]).dump(-1, ' ', false, ojson::error_handler_t::replace));
    };
    out += fmt::format("  tokenizer      {} (pre {}), vocab {}, bos {}, eos {}\n", t["model"].get<std::string>(),
                       t["pre"].get<std::string>(), t["n_vocab"].get<int>(), tok_text(t["bos"]), tok_text(t["eos"]));
    const auto& m = j["memory"];
    std::string fam = m["weights"].get<std::string>() == "int8" ? "INT8" : m["weights"].get<std::string>();
    if (!m["lowbit_matrices"].empty()) {
        fam += " (kept:";
        for (const auto& [name, n] : m["lowbit_matrices"].items()) fam += fmt::format(" {} {}", n.get<int>(), name);
        fam += ")";
    }
    out += fmt::format("  memory         weights {} in {}; KV ({}) {} a token, {} for the training context\n",
                       size_text(m["weight_bytes"].get<double>()), fam, m["kv_dtype"].get<std::string>(),
                       size_text(m["kv_bytes_per_token"].get<double>()),
                       size_text(m["kv_bytes_train_context"].get<double>()));
    out += fmt::format("  decode reads   {} of weights a token{}\n", size_text(m["decode_bytes_per_token"].get<double>()),
                       m["expert_bytes"].get<int64_t>() > 0
                           ? fmt::format(" (experts: {} in all)", size_text(m["expert_bytes"].get<double>()))
                           : std::string());
    write_out(out);
}

int cmd_info(const info_opts& o) {
    const ojson j = describe(resolve_model(o.model), o);
    if (o.json) write_out(j.dump(-1, ' ', false, ojson::error_handler_t::replace) + "\n");
    else print_text(j);
    return 0;
}

} // namespace

void print_model_info(const std::string& path, bool json, const ojson& manifest) {
    info_opts o;
    o.model = path;
    const ojson j = describe(path, o);
    if (json) write_out(ojson{{"manifest", manifest}, {"info", j}}.dump(-1, ' ', false, ojson::error_handler_t::replace) + "\n");
    else print_text(j);
}

void register_info(CLI::App& app, registry& reg) {
    auto o = std::make_shared<info_opts>();
    auto* sub = app.add_subcommand("info", "what a GGUF model holds and what serving it takes, from its metadata "
                                           "(the weights are not read)");
    sub->add_option("model", o->model, "GGUF model (default: $TANDEM_MODEL)");
    sub->add_option("-m,--model", o->model, "the same, as a flag");
    sub->add_option("--kv", o->kv, "KV element type the memory line assumes: f16 (the default), int8, f32")
        ->check(one_of({"f16", "int8", "f32"}));
    sub->add_option("--weights", o->weights, "the weight family the memory line assumes: auto (the default: low-bit "
                                             "matrices keep their bits) or int8")
        ->check(one_of({"auto", "int8"}));
    sub->add_option("--page-size", o->page_size, "KV page size in tokens (tandemd's page_size; default 16)")
        ->check(between(1, 4096));
    sub->add_flag("--json", o->json, "print one JSON object");
    reg.push_back({sub, [o] { return cmd_info(*o); }});
}

} // namespace tandem::cli
