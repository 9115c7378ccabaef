// `tandem embed`: embeddings of texts, from the daemon (/v1/embeddings) or offline (-m MODEL).
#include "daemon/cli_client.hpp"

#include "runtime/engine.hpp"
#include "runtime/error.hpp"
#include "runtime/generate.hpp"
#include "runtime/gguf.hpp"

#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <sstream>

#include <unistd.h>

namespace tandem::cli {

namespace {

using client::json;

struct embed_opts {
    client::client_opts daemon; // --socket, --wait
    std::vector<std::string> texts;
    std::string model;          // -m: offline
    int threads = 0;
    bool json = false;
};

// The texts: the arguments, else stdin's lines (empty lines skipped).
std::vector<std::string> texts_of(const embed_opts& o) {
    if (!o.texts.empty()) return o.texts;
    std::vector<std::string> out;
    std::istringstream in(read_stdin());
    for (std::string line; std::getline(in, line);)
        if (!line.empty()) out.push_back(line);
    return out;
}

// One line a text: its vector as a JSON array; or, with --json, the whole response object
// (the daemon's as it came).
void print(const std::string& response, bool whole) {
    if (whole) {
        write_out(response.ends_with('\n') ? response : response + "\n");
        return;
    }
    const json j = json::parse(response);
    for (const auto& d : j["data"]) write_out(d["embedding"].dump() + "\n");
}

// Offline: the in-process engine, each text an embedding request (the model's pooling).
nlohmann::ordered_json embed_offline(const embed_opts& o, const std::vector<std::string>& texts) {
    const std::string path = resolve_model(o.model);
    model_bundle b = load_model(path);
    engine_options eo;
    eo.n_threads = o.threads > 0 ? o.threads : default_threads();
    auto eng = make_local_engine(*b.mdl, *b.tok, eo);
    std::mutex mu;
    std::condition_variable cv;
    std::vector<std::vector<float>> vectors(texts.size());
    std::string failure;
    size_t n_done = 0;
    int64_t n_tokens = 0;
    for (size_t i = 0; i < texts.size(); ++i) {
        engine_request r;
        r.prompt = b.tok->encode(texts[i], true, false);
        n_tokens += int64_t(r.prompt.size());
        if (int64_t(r.prompt.size()) >= b.cfg.n_ctx_train) { // never cut: what does not fit is an error with its numbers
            eng->stop();
            throw error("text " + std::to_string(i + 1) + " has " + std::to_string(r.prompt.size()) +
                        " tokens, more than the " + std::to_string(b.cfg.n_ctx_train - 1) +
                        " the model's context holds (its training context, " + std::to_string(b.cfg.n_ctx_train) +
                        ", less one): shorten it");
        }
        r.embed = b.cfg.pooling;
        const auto sr = eng->submit(std::move(r), [&, i](engine_event&& ev) {
            if (!ev.done) return;
            std::lock_guard lock(mu);
            if (ev.embedding.empty()) failure = "text " + std::to_string(i + 1) + ": " + ev.finish_reason + " " + ev.error;
            vectors[i] = std::move(ev.embedding);
            ++n_done;
            cv.notify_all();
        });
        if (sr.status != submit_status::ok) {
            eng->stop();
            throw error("text " + std::to_string(i + 1) + " does not fit in the model's context");
        }
    }
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return n_done == texts.size(); });
    lock.unlock();
    eng->stop();
    if (!failure.empty()) throw error(failure);
    nlohmann::ordered_json data = nlohmann::ordered_json::array();
    for (size_t i = 0; i < vectors.size(); ++i)
        data.push_back({{"object", "embedding"}, {"index", i}, {"embedding", vectors[i]}});
    return nlohmann::ordered_json{{"object", "list"},
            {"data", std::move(data)},
            {"model", std::filesystem::path(path).stem().string()},
            {"usage", {{"prompt_tokens", n_tokens}, {"total_tokens", n_tokens}}}};
}

int cmd_embed(embed_opts& o) {
    if (o.texts.empty() && ::isatty(STDIN_FILENO) == 1) {
        std::fputs("tandem: embed: give texts as arguments, or one a line on stdin\n", stderr);
        return exit_usage;
    }
    const std::vector<std::string> texts = texts_of(o);
    if (texts.empty()) {
        std::fputs("tandem: embed: no text given (as arguments, or one a line on stdin)\n", stderr);
        return exit_usage;
    }
    if (!o.model.empty()) {
        print(embed_offline(o, texts).dump(), o.json);
        return client::exit_ok;
    }
    const client::terminal t;
    const ipc::client c(ipc::default_socket_path(o.daemon.socket));
    const client::posted p = client::post_json(c, t, o.daemon, "/v1/embeddings", json{{"input", texts}});
    if (p.rc != client::exit_ok) return p.rc;
    print(p.r.body, o.json);
    return client::exit_ok;
}

} // namespace

void register_embed(CLI::App& app, registry& reg) {
    auto o = std::make_shared<embed_opts>();
    auto* sub = app.add_subcommand("embed", "embeddings of texts: one JSON array a line (the daemon's, or -m offline)");
    sub->add_option("text", o->texts, "texts to embed, one an argument (default: stdin, one a line)");
    sub->add_option("-m,--model", o->model, "a GGUF to embed with offline, in this process (no daemon)");
    sub->add_option("-t,--threads", o->threads, "threads, offline (default: every core)")->check(at_least(1));
    sub->add_flag("--json", o->json, "print the OpenAI-shaped response object instead of one vector a line");
    client::add_socket(*sub, o->daemon);
    sub->add_option("--wait", o->daemon.wait_s,
                    "seconds to wait for a daemon that is busy or still loading (default 60; 0: do not wait)")
        ->check(between(0, 86400, number::real));
    reg.push_back({sub, [o] { return cmd_embed(*o); }});
}

} // namespace tandem::cli
